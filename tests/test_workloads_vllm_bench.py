"""The specs that replay ``vllm bench serve``'s synthetic datasets: ``random`` (RandomDataset) and
``prefix-repetition`` (PrefixRepetitionRandomDataset, built on ``shared-prefix``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ServesimError
from servesim.workloads import (
    UNIQUE,
    PrefixRepetition,
    RandomPrompts,
    SharedPrefix,
    build_workload,
    parse_generator_spec,
    prefix_sharing,
)
from servesim.workloads.lengths import Fixed


def draw(generator, n: int, seed: int = 0):
    return generator.sample(np.random.default_rng(seed), n)


# --- random -----------------------------------------------------------------------------------------------------


def test_spec_defaults_follow_the_benchmark():
    assert parse_generator_spec("random:1024:128") == RandomPrompts(1024, 128, 0.0, 0)
    assert parse_generator_spec("random:1024:128:0.5:256") == RandomPrompts(1024, 128, 0.5, 256)
    assert RandomPrompts() == RandomPrompts(1024, 128, 0.0, 0)


@pytest.mark.parametrize("input_len, output_len, ratio", [(1024, 128, 0.5), (1000, 100, 0.33), (7, 3, 0.8),
                                                          (100, 1, 0.99)])
def test_range_ratio_bounds_are_floor_and_ceil_and_output_at_least_1(input_len, output_len, ratio):
    generator = RandomPrompts(input_len, output_len, ratio)
    (in_low, in_high), (out_low, out_high) = generator.bounds()
    assert (in_low, in_high) == (math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio)))
    assert (out_low, out_high) == (max(math.floor(output_len * (1 - ratio)), 1),
                                   max(math.ceil(output_len * (1 + ratio)), 1))
    lengths, _ = draw(generator, 20_000)
    assert in_low <= lengths[:, 0].min() and lengths[:, 0].max() <= in_high
    assert out_low <= lengths[:, 1].min() and lengths[:, 1].max() <= out_high
    # uniform over the inclusive integers: both ends are reached
    assert {lengths[:, 0].min(), lengths[:, 0].max()} == {in_low, in_high} or in_high - in_low > 2000


def test_1024_128_half_range_with_a_256_token_prefix():
    lengths, prefixes = draw(RandomPrompts(1024, 128, 0.5, 256), 5000)
    assert lengths[:, 0].min() == 256 + 512 and lengths[:, 0].max() == 256 + 1536
    assert lengths[:, 1].min() == 64 and lengths[:, 1].max() == 192
    assert abs(lengths[:, 0].mean() - (256 + 1024)) < 15


def test_ratio_0_gives_exact_lengths():
    lengths, prefixes = draw(RandomPrompts(1024, 128), 100)
    assert (lengths[:, 0] == 1024).all() and (lengths[:, 1] == 128).all()
    assert (prefixes.segment_ids == UNIQUE).all() and (np.diff(prefixes.offsets) == 1).all()


def test_the_prefix_is_one_segment_id_shared_by_every_request_and_the_rest_is_unique():
    lengths, prefixes = draw(RandomPrompts(512, 64, 0.25, 100), 500)
    assert np.array_equal(prefixes.prompt_tokens(), lengths[:, 0])
    firsts = prefixes.segment_ids[prefixes.offsets[:-1]]
    assert (firsts == firsts[0]).all() and firsts[0] != UNIQUE
    assert (prefixes.segment_tokens[prefixes.offsets[:-1]] == 100).all()
    own = prefixes.offsets[1:] - 1
    assert (prefixes.segment_ids[own] == UNIQUE).all()
    assert np.array_equal(prefixes.segment_tokens[own], lengths[:, 0] - 100)
    # a prefix cache serves the prefix (whole 16-token blocks) to every request after the first
    stats = prefix_sharing(prefixes, lengths[:, 1])
    assert stats["requests_reusing"] == pytest.approx(499 / 500)
    assert stats["distinct_prefixes"] == 1


def test_a_zero_length_draw_after_the_prefix_leaves_the_prefix_alone():
    lengths, prefixes = draw(RandomPrompts(1, 1, 0.5, 8), 200)
    assert set(lengths[:, 0].tolist()) <= {8, 9, 10}
    assert np.array_equal(prefixes.prompt_tokens(), lengths[:, 0])
    assert (prefixes.segment_tokens >= 1).all()


def test_seeded_draws_reproduce():
    spec = "random:1024:128:0.5:256"
    a, b = build_workload(spec, 300, qps=5, seed=11), build_workload(spec, 300, qps=5, seed=11)
    assert a == b
    assert build_workload(spec, 300, qps=5, seed=12) != a
    # the lengths do not depend on the arrivals
    assert np.array_equal(build_workload(spec, 300, concurrency=8, seed=11).prompt_tokens, a.prompt_tokens)


@pytest.mark.parametrize("ratio", ["1", "1.0", "1.5", "-0.1", "nan"])
def test_a_ratio_outside_0_to_1_is_one_line_naming_a_ratio_that_works(ratio):
    with pytest.raises(ServesimError) as error:
        parse_generator_spec(f"random:1024:128:{ratio}")
    message = str(error.value)
    assert "\n" not in message and "range ratio" in message and "0.5" in message


@pytest.mark.parametrize("spec, words", [
    ("random:1024", "2 to 4 parts"),
    ("random:1024:128:0.5:256:9", "2 to 4 parts"),
    ("random:lots:128", "whole numbers"),
    ("random:1024:128:0.5:2.5", "whole numbers"),
    ("random:0:128", "input length"),
    ("random:1024:0", "output length"),
    ("random:1024:128:0:-1", "prefix length"),
    ("random:1:128:0.5", "0 tokens"),
])
def test_bad_random_specs_are_one_line_errors(spec, words):
    with pytest.raises(ServesimError, match=words) as error:
        build_workload(spec, 10, qps=1)
    assert "\n" not in str(error.value)


def test_cli_runs_the_example_and_reports_prompt_sharing():
    result = CliRunner().invoke(main, ["workload", "random:1024:128:0.5:256", "--qps", "4"])
    assert result.exit_code == 0, result.output
    assert "random:1024:128:0.5:256" in result.output
    assert "distinct prompts" in result.output and "prefix cache" in result.output
    result = CliRunner().invoke(main, ["workload", "random:1024:128:0.5:256", "--qps", "4", "--json"])
    sharing = json.loads(result.output)[0]["prefix_sharing"]
    assert sharing["distinct_prefixes"] == 1 and sharing["requests_reusing"] == pytest.approx(0.999)


# --- prefix-repetition ------------------------------------------------------------------------------------------


def test_prefix_repetition_is_shared_prefix_with_one_shuffled_pass():
    generator = parse_generator_spec("prefix-repetition:256:256:10:128")
    assert generator == PrefixRepetition(256, 256, 10, 128) == PrefixRepetition()
    assert generator.shared_prefix(1000) == SharedPrefix(10, 100, Fixed(256), Fixed(256), Fixed(128))
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    lengths, prefixes = generator.sample(rng_a, 1000)
    same_lengths, same_prefixes = generator.shared_prefix(1000).sample(rng_b, 1000)
    assert np.array_equal(lengths, same_lengths) and prefixes == same_prefixes


def test_prefix_repetition_sends_every_prefix_suffix_pair_once_in_a_shuffled_order():
    lengths, prefixes = draw(PrefixRepetition(64, 32, 4, 16), 40)
    assert (lengths[:, 0] == 96).all() and (lengths[:, 1] == 16).all()
    groups = prefixes.segment_ids[0::2]
    suffixes = prefixes.segment_ids[1::2]
    assert sorted(np.bincount(groups).tolist()) == [10, 10, 10, 10]
    assert len(set(suffixes.tolist())) == 40  # each suffix its own text
    assert (prefixes.segment_tokens[0::2] == 64).all() and (prefixes.segment_tokens[1::2] == 32).all()
    assert not (np.diff(groups) >= 0).all()  # shuffled, not grouped
    assert prefix_sharing(prefixes, lengths[:, 1])["distinct_prefixes"] == 4


def test_prefix_repetition_refuses_a_count_the_benchmark_would_cut():
    with pytest.raises(ServesimError, match="multiple of 10 requests, not 1005.* = 1000\\); ask for 1000") as error:
        build_workload("prefix-repetition:256:256:10:128", 1005, qps=1)
    assert "\n" not in str(error.value)
    with pytest.raises(ServesimError, match="ask for 10 requests"):
        build_workload("prefix-repetition:256:256:10:128", 5, qps=1)


def test_prefix_repetition_seeded_and_via_the_cli():
    spec = "prefix-repetition:128:64:5:32"
    assert build_workload(spec, 50, qps=2, seed=1) == build_workload(spec, 50, qps=2, seed=1)
    result = CliRunner().invoke(main, ["workload", spec, "-n", "50", "--concurrency", "4"])
    assert result.exit_code == 0, result.output
    assert "distinct prompts" in result.output


def test_prefix_repetition_is_the_documented_shared_prefix_spec():
    alias = build_workload("prefix-repetition:256:256:10:128", 1000, qps=3, seed=5)
    spelled = build_workload("shared-prefix:10,100:256:256:128", 1000, qps=3, seed=5)
    assert np.array_equal(alias.prompt_tokens, spelled.prompt_tokens)
    assert np.array_equal(alias.arrival_s, spelled.arrival_s)
    assert alias.prefixes == spelled.prefixes
