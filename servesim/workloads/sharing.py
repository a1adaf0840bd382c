"""Operations on prompt segments (:class:`~servesim.workloads.prefix.PromptSegments`) and the prompt-sharing
statistics ``servesim workload`` reports.

:func:`cached_prompt_tokens` walks the requests in arrival order through a trie of segment ids, the way an
unbounded prefix cache would see them: each request finds the longest prefix that an earlier request's prompt, or an
earlier prompt followed by its output (``output_ids``), already holds. The trie is built level by level (segment
position within the prompt) with sorts, so the work is O(total segments · log) in numpy, with one Python iteration
per level (the most segments one prompt has).
"""

from __future__ import annotations

import numpy as np

from servesim.workloads.prefix import UNIQUE, PromptSegments

#: Block size of the cache-hit upper bound: vLLM's default KV block of 16 tokens.
CACHE_BLOCK_TOKENS = 16


def truncate_segments(prefixes: PromptSegments, max_tokens: int | None) -> PromptSegments:
    """Every prompt cut to its first ``max_tokens`` tokens: segments past the limit dropped, the one across it
    shortened (it keeps its id, so it shares its shorter length with prompts that hold it whole)."""
    if max_tokens is None:
        return prefixes
    offsets, tokens = prefixes.offsets, prefixes.segment_tokens
    counts = np.diff(offsets)
    ends = np.cumsum(tokens)
    starts = ends - tokens - np.repeat(ends[offsets[:-1]] - tokens[offsets[:-1]], counts)  # start within prompt
    if (starts + tokens <= max_tokens).all():
        return prefixes
    keep = starts < max_tokens
    request = np.repeat(np.arange(len(prefixes)), counts)
    kept_counts = np.bincount(request[keep], minlength=len(prefixes))
    return PromptSegments(
        np.concatenate([[0], np.cumsum(kept_counts)]),
        prefixes.segment_ids[keep],
        np.minimum(tokens, max_tokens - starts)[keep],
        prefixes.output_ids,
    )


def _groups(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts rows by ``keys`` (last key most significant, like ``np.lexsort``), and for each sorted
    row whether it starts a new group of equal keys, ignoring the first key (the within-group order)."""
    order = np.lexsort(keys)
    starts = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        starts[1:] = np.logical_or.reduce([np.diff(key[order]) != 0 for key in keys[1:]])
    return order, starts


def _trie(prefixes: PromptSegments, output_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each prompt segment: its trie node (equal for equal paths of (id, tokens) from the prompt's start), the
    first request whose prompt, or prompt and output, holds that node, and the most tokens an earlier request
    held under the same parent and id (0 if none), which a segment of another length shares in part."""
    offsets = prefixes.offsets
    n, total = len(prefixes), len(prefixes.segment_ids)
    counts = np.diff(offsets)
    ids = prefixes.segment_ids.copy()
    unique = ids == UNIQUE
    ids[unique] = -2 - np.arange(unique.sum())  # text nobody repeats: an id of its own
    # occurrences: every prompt segment, then the outputs that a later prompt may hold
    quoted = np.flatnonzero(prefixes.output_ids != UNIQUE)
    occ_request = np.concatenate([np.repeat(np.arange(n), counts), quoted])
    occ_depth = np.concatenate([np.arange(total) - np.repeat(offsets[:-1], counts), counts[quoted]])
    occ_id = np.concatenate([ids, prefixes.output_ids[quoted]])
    occ_tokens = np.concatenate([prefixes.segment_tokens, np.asarray(output_tokens, dtype=np.int64)[quoted]])
    occ_parent_segment = np.concatenate([np.arange(total) - 1, offsets[quoted + 1] - 1])
    node = np.empty(len(occ_id), dtype=np.int64)
    first = np.empty(len(occ_id), dtype=np.int64)
    earlier_max = np.zeros(len(occ_id), dtype=np.int64)
    by_depth = np.argsort(occ_depth, kind="stable")
    bounds = np.searchsorted(occ_depth[by_depth], np.arange(occ_depth.max() + 2 if len(occ_depth) else 1))
    next_node = 0
    for depth in range(len(bounds) - 1):
        sel = by_depth[bounds[depth]:bounds[depth + 1]]
        parent = np.full(len(sel), -1, dtype=np.int64) if depth == 0 else node[occ_parent_segment[sel]]
        request, seg_id, tokens = occ_request[sel], occ_id[sel], occ_tokens[sel]
        order, starts = _groups(request, tokens, seg_id, parent)
        group = np.cumsum(starts) - 1
        node[sel[order]] = next_node + group
        first[sel[order]] = request[order][np.flatnonzero(starts)][group]
        next_node += int(group[-1]) + 1
        # the most tokens an earlier request held under the same (parent, id): running max within each group
        order, starts = _groups(request, seg_id, parent)
        group = np.cumsum(starts) - 1
        shift = group * np.int64(2**32)
        running = np.maximum.accumulate(tokens[order] + shift) - shift
        before = np.zeros(len(order), dtype=np.int64)
        before[1:] = np.where(starts[1:], 0, running[:-1])
        earlier_max[sel[order]] = before
    return node[:total], first[:total], earlier_max[:total]


def _walk(prefixes: PromptSegments, output_tokens: np.ndarray):
    """Per request: tokens of its prompt already held by earlier requests, and how many leading segments whole."""
    n = len(prefixes)
    offsets, tokens = prefixes.offsets, prefixes.segment_tokens
    node, first, earlier_max = _trie(prefixes, output_tokens)
    counts = np.diff(offsets)
    request = np.repeat(np.arange(n), counts)
    depth = np.arange(len(tokens)) - np.repeat(offsets[:-1], counts)
    held = first < request  # prefix-closed: a held node's parent was held by the same earlier request
    whole = np.minimum.reduceat(np.where(held, counts[request], depth), offsets[:-1])  # first segment not held
    held_tokens = np.add.reduceat(np.where(held, tokens, 0), offsets[:-1])
    partial_at = offsets[:-1] + whole
    partial = np.zeros(n, dtype=np.int64)
    cut = whole < counts
    partial[cut] = np.minimum(tokens[partial_at[cut]], earlier_max[partial_at[cut]])
    return held_tokens + partial, whole, node


def cached_prompt_tokens(prefixes: PromptSegments, output_tokens: np.ndarray,
                         block_tokens: int = CACHE_BLOCK_TOKENS) -> np.ndarray:
    """Per request, the prompt tokens an unbounded prefix cache could serve: the longest prefix that an earlier
    request (in arrival order, assumed finished) held in its prompt, or its prompt and output, rounded down to
    whole blocks of ``block_tokens``, and at most the prompt less one token (the engines always compute the last
    prompt token, to sample the first output token)."""
    matched, _, _ = _walk(prefixes, output_tokens)
    prompt = prefixes.prompt_tokens()
    return np.minimum(matched, prompt - 1) // block_tokens * block_tokens


def prefix_sharing(prefixes: PromptSegments, output_tokens: np.ndarray,
                   block_tokens: int = CACHE_BLOCK_TOKENS) -> dict:
    """Prompt-sharing statistics of a workload, in arrival order:

    - ``distinct_prompts``: how many different whole prompts;
    - ``distinct_prefixes``: how many different prefixes later requests reuse (each reusing request's longest
      whole-segment prefix held by an earlier request);
    - ``requests_reusing``: the fraction of requests whose prompt starts with text an earlier request held;
    - ``cache_hit_upper_bound``: the fraction of prompt tokens an unbounded cache of ``block_tokens``-token blocks
      would serve (:func:`cached_prompt_tokens`), an upper bound on any real cache's hit rate;
    - ``cache_block_tokens``: that block size.
    """
    n = len(prefixes)
    if not n:
        return {"distinct_prompts": 0, "distinct_prefixes": 0, "requests_reusing": float("nan"),
                "cache_hit_upper_bound": float("nan"), "cache_block_tokens": block_tokens}
    matched, whole, node = _walk(prefixes, output_tokens)
    prompt = prefixes.prompt_tokens()
    cached = np.minimum(matched, prompt - 1) // block_tokens * block_tokens
    offsets = prefixes.offsets
    reused = whole > 0
    return {
        "distinct_prompts": int(len(np.unique(node[offsets[1:] - 1]))),
        "distinct_prefixes": int(len(np.unique(node[offsets[:-1][reused] + whole[reused] - 1]))),
        "requests_reusing": float(np.mean(matched > 0)),
        "cache_hit_upper_bound": float(cached.sum() / prompt.sum()),
        "cache_block_tokens": block_tokens,
    }
