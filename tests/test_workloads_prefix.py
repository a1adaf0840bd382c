"""Prompt identity: trace prompt_id / hash_ids / segments, the shared-prompt generators, truncation, the
cache-hit upper bound and the ``--out`` round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.workloads import (
    UNIQUE,
    PromptSegments,
    build_workload,
    cached_prompt_tokens,
    describe_workload,
    load_trace,
    parse_columns,
    parse_generator_spec,
    prefix_sharing,
    source_names,
    truncate_segments,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def cli(*args: str):
    return CliRunner().invoke(main, ["workload", *args])


# --- traces ---------------------------------------------------------------------------------------------------

MOONCAKE = (
    '{"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 3]}\n'
    '{"timestamp": 500, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 4]}\n'
    '{"timestamp": 250, "input_length": 300, "output_length": 0, "hash_ids": [7]}\n'
)


def test_mooncake_jsonl_loads_with_millisecond_times_and_512_token_blocks(tmp_path):
    trace = load_trace(write(tmp_path, "mooncake.jsonl", MOONCAKE))
    assert trace.arrival_s.tolist() == [0.0, 0.25, 0.5]  # milliseconds, sorted
    assert trace.prompt_tokens.tolist() == [1200, 300, 1100]
    assert trace.output_tokens.tolist() == [10, 1, 5]
    p = trace.prefixes
    assert [p.segments(i)[0].tolist() for i in range(3)] == [[1, 2, 3], [7], [1, 2, 4]]
    assert [p.segments(i)[1].tolist() for i in range(3)] == [[512, 512, 176], [300], [512, 512, 76]]
    assert (p.output_ids == UNIQUE).all()


@pytest.mark.parametrize("cell", ['"[1, 2]"', '"1 2"', '"1,2"', "[1 2]"])
def test_hash_ids_in_csv_as_text_and_through_a_column_mapping(tmp_path, cell):
    path = write(tmp_path, "m.csv", f"t,in,out,h\n0,600,5,{cell}\n1,700,5,1 3\n")
    trace = load_trace(path, parse_columns("prompt=in,output=out,arrival=t,hash_ids=h"))
    assert trace.prefixes.segment_ids.tolist() == [1, 2, 1, 3]
    assert trace.prefixes.segment_tokens.tolist() == [512, 88, 512, 188]


def test_hash_block_size_can_be_set(tmp_path):
    path = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 250, "output_length": 5, '
                                      '"hash_ids": [4, 5, 6]}\n')
    assert load_trace(path, hash_block_tokens=100).prefixes.segment_tokens.tolist() == [100, 100, 50]
    assert build_workload(str(path), hash_block_tokens=100).prefixes.segment_ids.tolist() == [4, 5, 6]


def test_prompt_id_names_whole_prompts_in_csv_and_jsonl(tmp_path):
    csv = write(tmp_path, "p.csv", "arrival_s,prompt_tokens,output_tokens,prompt_id\n"
                                   "0,100,5,a\n1,100,5,b\n2,100,6,a\n3,50,3,\n")
    jsonl = write(tmp_path, "p.jsonl", "".join(
        json.dumps({"arrival_s": i, "prompt_tokens": p, "output_tokens": 5, "prompt_id": pid}) + "\n"
        for i, (p, pid) in enumerate([(100, "a"), (100, "b"), (100, "a"), (50, None)])))
    for path in (csv, jsonl):
        prefixes = load_trace(path).prefixes
        assert prefixes.segment_ids.tolist() == [0, 1, 0, UNIQUE]  # an empty id: a prompt of its own
        assert prefixes.segment_tokens.tolist() == [100, 100, 100, 50]
    empty = write(tmp_path, "e.csv", "prompt_tokens,output_tokens,prompt_id\n10,1,\n20,1,\n")
    assert load_trace(empty).prefixes.segment_ids.tolist() == [UNIQUE, UNIQUE]
    mapped = write(tmp_path, "q.csv", "in,out,conversation\n10,1,x\n10,1,x\n")
    trace = load_trace(mapped, parse_columns("prompt=in,output=out,prompt_id=conversation"))
    assert trace.prefixes.segment_ids.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "prompt_tokens,output_tokens,prompt_id\n100,5,a\n100,5,b\n101,6,a\n",
         r"a.csv line 4: prompt_id 'a' has 101 prompt tokens, but line 2 gave it 100"),
        ("a.jsonl", MOONCAKE.replace("[1, 2, 4]", "[1, 2]"),
         r"line 2: hash_ids has 2 block ids, but 1100 prompt tokens make 3 blocks of 512"),
        ("a.jsonl", MOONCAKE.replace("[7]", "[7, 8]"), r"line 3: hash_ids has 2 block ids"),
        ("a.jsonl", MOONCAKE.replace("[7]", '["x"]'), r"line 3: hash_ids is .*expected a list of whole numbers"),
        ("a.jsonl", MOONCAKE.replace("[7]", "[-3]"), r"line 3: hash_ids is .*>= 0"),
        ("a.csv", "prompt_tokens,output_tokens,hash_ids\n600,5,1 x\n", r"line 2: hash_ids is '1 x'"),
        ("a.csv", "prompt_tokens,output_tokens,prompt_id,hash_ids\n600,5,a,1 2\n", "both prompt_id and hash_ids"),
        ("a.csv", "prompt_tokens,output_tokens,segment_ids,segment_tokens\n10,5,1 2,4 5\n",
         r"line 2: segment_tokens add up to 9 tokens, not the prompt's 10"),
        ("a.csv", "prompt_tokens,output_tokens,segment_ids,segment_tokens\n10,5,1,4 6\n",
         r"line 2: segment_ids has 1 ids and segment_tokens 2 lengths"),
        ("a.csv", "prompt_tokens,output_tokens,segment_ids\n10,5,1\n", "go together"),
    ],
)
def test_inconsistent_prompt_identity_is_one_line_naming_the_row(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(ServesimError, match=message) as caught:
        load_trace(path)
    assert "\n" not in str(caught.value)
    result = cli(str(path), "--qps", "1")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "error:" in result.output


def test_a_trace_without_identity_has_no_prefixes(tmp_path):
    path = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n1,20,3\n")
    assert load_trace(path).prefixes is None and build_workload(str(path)).prefixes is None
    assert describe_workload(build_workload(str(path)))["prefix_sharing"] is None


def test_first_rows_and_truncation_keep_segments_consistent(tmp_path):
    path = str(write(tmp_path, "mooncake.jsonl", MOONCAKE))
    head = build_workload(path, 2)
    assert head.prefixes.segment_ids.tolist() == [1, 2, 3, 7]
    cut = build_workload(path, max_prompt_tokens=600)
    assert cut.prompt_tokens.tolist() == [600, 300, 600]
    assert cut.prefixes.segment_ids.tolist() == [1, 2, 7, 1, 2]
    assert cut.prefixes.segment_tokens.tolist() == [512, 88, 300, 512, 88]


# --- generators -----------------------------------------------------------------------------------------------

SPECS = ["shared-prefix:3,4:100-300:10-50:5-20", "repeat:7:20-80:4", "multi-turn:5,4:10-40:3-30",
         "multi-turn:1,1:8:2", "chat-shared-prefix"]


@pytest.mark.parametrize("spec", SPECS)
def test_generators_are_seeded_and_reproducible(spec):
    a, b = build_workload(spec, 300, qps=2, seed=3), build_workload(spec, 300, qps=2, seed=3)
    assert a == b and a.prefixes is not None
    assert build_workload(spec, 300, qps=2, seed=4).prefixes != a.prefixes or spec == "multi-turn:1,1:8:2"
    assert build_workload(spec, 300, qps=9, arrival="gamma", cv=2, seed=3).prefixes == a.prefixes


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from(SPECS), n=st.integers(1, 200), seed=st.integers(0, 2**16),
       limit=st.none() | st.integers(1, 400))
def test_segments_always_add_up_to_the_prompt(spec, n, seed, limit):
    workload = build_workload(spec, n, concurrency=4, seed=seed, max_prompt_tokens=limit)
    assert np.array_equal(workload.prefixes.prompt_tokens(), workload.prompt_tokens)  # Workload checks it too
    if limit is not None:
        assert workload.prompt_tokens.max() <= limit


def test_shared_prefix_prompts_are_group_prefix_then_question_cycled_in_passes():
    workload = build_workload("shared-prefix:2,3:100:20:5", 12, qps=1)
    p = workload.prefixes
    ids = p.segment_ids.reshape(-1, 2)
    assert (ids[:, 0] == (ids[:, 1] - 2) // 3).all()  # question p belongs to group p // 3
    assert sorted(ids[:6, 1].tolist()) == sorted(ids[6:, 1].tolist()) == [2, 3, 4, 5, 6, 7]  # each pass once
    assert workload.prompt_tokens.tolist() == [120] * 12 and workload.output_tokens.tolist() == [5] * 12


def test_repeat_cycles_a_set_of_prompts():
    workload = build_workload("repeat:4:50-60:8", 40, qps=1)
    ids = workload.prefixes.segment_ids
    assert set(ids.tolist()) == {0, 1, 2, 3} and np.bincount(ids).tolist() == [10] * 4
    lengths = {i: set(workload.prompt_tokens[ids == i].tolist()) for i in range(4)}
    assert all(len(v) == 1 for v in lengths.values())  # a prompt keeps its length


@settings(max_examples=30, deadline=None)
@given(active=st.integers(1, 6), turns=st.integers(1, 5), n=st.integers(1, 80), seed=st.integers(0, 999),
       system=st.booleans())
def test_each_turn_holds_the_previous_turn_and_its_answer_and_comes_later(active, turns, n, seed, system):
    spec = "chat-shared-prefix" if system else f"multi-turn:{active},{turns}:1-30:1-30"
    workload = build_workload(spec, n, qps=3, seed=seed)
    p, output = workload.prefixes, workload.output_tokens
    by_output = {int(o): i for i, o in enumerate(p.output_ids) if o != UNIQUE}
    quoted = 0
    for i in range(len(workload)):
        ids, tokens = p.segments(i)
        answers = [j for j, s in enumerate(ids) if int(s) in by_output]
        if not answers:
            continue
        quoted += 1
        cut = answers[-1]  # the last answer this prompt holds: the previous turn's
        previous = by_output[int(ids[cut])]
        prev_ids, prev_tokens = p.segments(previous)
        assert previous < i and workload.arrival_s[previous] <= workload.arrival_s[i]
        assert ids[:cut].tolist() == prev_ids.tolist() and tokens[:cut].tolist() == prev_tokens.tolist()
        assert tokens[cut] == output[previous]
        assert len(ids) == cut + 2 and ids[-1] not in prev_ids  # then one new message
    assert quoted == len(by_output)  # every named answer is held by a later prompt


def test_multi_turn_spaces_turns_by_the_active_conversations():
    p = build_workload("multi-turn:3,3:10:5", 12, qps=1).prefixes
    assert p.segments(3)[0].tolist() == [0, 12, 3]  # request 3 is request 0's next turn
    assert p.output_ids[0] == 12 and p.output_ids[2] == UNIQUE  # slot 2 opens with a 1-turn conversation


@pytest.mark.parametrize(("spec", "message"), [
    ("shared-prefix:3,4:100:10", "needs 4 parts"),
    ("shared-prefix:3:100:10:5", "cannot read workload spec"),
    ("shared-prefix:3,x:100:10:5", "cannot read workload spec"),
    ("repeat:0:100:5", "the number of distinct prompts must be 1"),
    ("multi-turn:4,2:10-5:5", "cannot read|1 <= low <= high"),
])
def test_bad_generator_specs_are_explained(spec, message):
    with pytest.raises(ServesimError, match=message):
        parse_generator_spec(spec)


def test_presets_are_listed_with_the_profiles():
    assert "chat-shared-prefix" in source_names() and "arxiv" in source_names()
    with pytest.raises(ServesimError, match="chat-shared-prefix"):
        build_workload("chat-shared-prefx", qps=1)


# --- the cache-hit upper bound --------------------------------------------------------------------------------

def reference_cached(p: PromptSegments, output: np.ndarray, block: int) -> list[int]:
    """The upper bound by a plain trie walk, one request at a time: children keyed by (id, tokens)."""
    root: dict = {}
    cached = []
    for i in range(len(p)):
        ids, tokens = (x.tolist() for x in p.segments(i))
        node, matched = root, 0
        for s, t in zip(ids, tokens):
            if s != UNIQUE and (s, t) in node:
                node, matched = node[(s, t)], matched + t
                continue
            longer = [length for (sid, length) in node if sid == s and s != UNIQUE]
            matched += min(t, max(longer)) if longer else 0
            break
        cached.append(min(matched, sum(tokens) - 1) // block * block)
        node = root
        path = list(zip(ids, tokens)) + ([(int(p.output_ids[i]), int(output[i]))] if p.output_ids[i] != UNIQUE else [])
        for s, t in path:
            if s == UNIQUE:
                break
            node = node.setdefault((s, t), {})
    return cached


segment_lists = st.lists(st.tuples(st.integers(-1, 3), st.integers(1, 40)), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(st.tuples(segment_lists, st.integers(-1, 4), st.integers(1, 40)), min_size=1, max_size=25),
       block=st.sampled_from([1, 4, 16]))
def test_cache_bound_matches_a_plain_trie_walk(prompts, block):
    segs = [s for segs, _, _ in prompts for s in segs]
    p = PromptSegments(np.concatenate([[0], np.cumsum([len(s) for s, _, _ in prompts])]), [s for s, _ in segs],
                       [t for _, t in segs], [o for _, o, _ in prompts])
    output = np.array([o for _, _, o in prompts])
    assert cached_prompt_tokens(p, output, block).tolist() == reference_cached(p, output, block)


def test_sharing_statistics_of_simple_cases():
    p = PromptSegments([0, 2, 4, 5], [7, 1, 7, 2, 7], [64, 10, 64, 20, 64], [UNIQUE] * 3)
    stats = prefix_sharing(p, np.ones(3, dtype=np.int64))
    assert stats["distinct_prompts"] == 3 and stats["distinct_prefixes"] == 1
    assert stats["requests_reusing"] == pytest.approx(2 / 3)
    assert stats["cache_hit_upper_bound"] == pytest.approx((64 + 48) / (74 + 84 + 64))  # 63 rounds down to 48
    repeated = build_workload("repeat:1:33:4", 10, qps=1)
    assert prefix_sharing(repeated.prefixes, repeated.output_tokens)["cache_hit_upper_bound"] == pytest.approx(
        9 * 32 / 330)


def test_truncation_cuts_the_segment_across_the_limit():
    p = PromptSegments([0, 3, 4], [1, 2, 3, 4], [10, 10, 10, 5], [UNIQUE, 9])
    cut = truncate_segments(p, 15)
    assert cut.offsets.tolist() == [0, 2, 3] and cut.segment_tokens.tolist() == [10, 5, 5]
    assert cut.output_ids.tolist() == [UNIQUE, 9] and truncate_segments(p, 30) is p


# --- servesim workload ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["chat-shared-prefix", "shared-prefix:4,5:100-200:10-30:5",
                                    "multi-turn:8,3:10-50:5-40", "repeat:3:20:5"])
def test_out_round_trips_the_segments(tmp_path, source):
    out = tmp_path / "w.csv"
    result = cli(source, "-n", "150", "--qps", "5", "--seed", "2", "--max-prompt-tokens", "1500", "--out", str(out))
    assert result.exit_code == 0, result.output
    generated = build_workload(source, 150, qps=5, seed=2, max_prompt_tokens=1500)
    reloaded = build_workload(str(out))
    assert reloaded.prefixes == generated.prefixes
    assert np.array_equal(reloaded.prompt_tokens, generated.prompt_tokens)
    assert np.array_equal(reloaded.output_tokens, generated.output_tokens)
    assert abs(reloaded.arrival_s - generated.arrival_s).max() < 1e-6
    again = tmp_path / "again.csv"
    assert cli(str(out), "--out", str(again)).exit_code == 0
    assert again.read_text() == out.read_text()


def test_out_of_a_trace_with_hash_ids_round_trips(tmp_path):
    out = tmp_path / "w.csv"
    assert cli(str(write(tmp_path, "m.jsonl", MOONCAKE)), "--out", str(out)).exit_code == 0
    assert build_workload(str(out)).prefixes == build_workload(str(tmp_path / "m.jsonl")).prefixes


def test_json_and_table_report_prompt_sharing():
    result = cli("repeat:10:100:5", "fixed:100:5", "-n", "100", "--qps", "1", "--json")
    shared, unique = json.loads(result.output)
    assert shared["prefix_sharing"]["distinct_prompts"] == 10 and unique["prefix_sharing"] is None
    assert shared["prefix_sharing"]["cache_hit_upper_bound"] == pytest.approx(90 * 96 / 10_000)
    assert shared["prefix_sharing"]["cache_block_tokens"] == 16
    table = cli("repeat:10:100:5", "-n", "100", "--qps", "1").output
    assert "10 distinct prompts" in table and "serves at most 86.4% of prompt tokens" in table
