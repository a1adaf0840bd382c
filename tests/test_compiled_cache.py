"""The prefix cache over arrays (servesim/serving/compiled_cache.py) answers every operation as the radix tree of
servesim/serving/prefix_cache.py does: the same hits, nodes referenced and made, units freed and counted."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.serving import compiled_cache as arrays
from servesim.serving.prefix_cache import PrefixCache
from servesim.workloads.prefix import UNIQUE, PromptSegments

UNIT_TOKENS = 16
#: Prompts of up to two segments over two ids of one length: at most 2 + 4 nodes are ever alive at once, so a heap
#: of 7 rows is enough once compacted, and sequences with few evictions fill it with stale rows.
PROMPTS = st.lists(st.sampled_from([0, 1, UNIQUE]), min_size=1, max_size=2)
#: (request, what it does next, units to evict): an idle request is admitted (its cache hit looked up and
#: referenced); one in flight inserts its prompt's segments, finishes (releases its nodes), or a pool short of
#: ``units`` evicts.
OPERATIONS = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["insert"] * 3 + ["release"] * 3 + ["evict"]),
                                st.integers(1, 4)), min_size=40, max_size=120)


class ArrayCache:
    """The array cache's functions over one set of arrays (made by ``new_cache``, grown to room for every node a
    test can make), with a heap of ``heap_rows`` rows."""

    def __init__(self, prompts: list[list[int]], heap_rows: int) -> None:
        segments = PromptSegments(np.cumsum([0] + [len(prompt) for prompt in prompts]),
                                  [i for prompt in prompts for i in prompt],
                                  [UNIT_TOKENS for prompt in prompts for _ in prompt], [UNIQUE] * len(prompts))
        self.segments = np.array([segments.segment_ids, segments.segment_tokens])
        self.offsets = segments.offsets
        self.nodes, self.children, lru, self.path, self.cs = arrays.new_cache(segments)
        while len(self.nodes) < 1000:
            self.nodes, self.children, lru = arrays.grown(self.nodes, self.children, lru)
        self.lru = lru[:heap_rows].copy()

    def at(self, request: int) -> int:
        return int(self.offsets[request]) + request


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(PROMPTS, min_size=6, max_size=6), operations=OPERATIONS)
def test_the_array_cache_matches_the_radix_tree(prompts, operations):
    tree = PrefixCache(UNIT_TOKENS, UNIT_TOKENS)
    cache = ArrayCache(prompts, heap_rows=7)
    paths: dict[int, list] = {}  # request -> the tree's nodes it references (in flight)
    lengths: dict[int, int] = {}  # request -> the array cache's path length
    for request, op, units in operations:
        ids = prompts[request]
        tokens = [UNIT_TOKENS] * len(ids)
        lo, hi = int(cache.offsets[request]), int(cache.offsets[request + 1])
        if request not in paths:
            path, matched = tree.match(ids, tokens)
            count, matched_here = arrays.match(cache.nodes, cache.children, cache.segments, lo, hi, cache.path,
                                               cache.at(request))
            assert (count, matched_here) == (len(path), matched)
            hit = tree.hit_tokens(matched, sum(tokens) + 1)  # the prompt and an answer token computed
            path = tree.covering(path, hit)
            covered, pinned = arrays.covering(cache.nodes, cache.path, cache.at(request), count, hit)
            assert (covered, pinned) == (len(path), tree.units_to_pin(path))
            tree.acquire(path)
            arrays.acquire(cache.nodes, cache.cs, cache.path, cache.at(request), covered)
            paths[request], lengths[request] = list(path), covered
        elif op == "insert":
            done = len(paths[request])
            added, new_units = tree.insert(paths[request], ids[done:], tokens[done:])
            assert arrays.insert(cache.nodes, cache.children, cache.cs, cache.segments, lo + done, hi, cache.path,
                                 cache.at(request), lengths[request], UNIT_TOKENS) == (len(added), new_units)
            paths[request] += added
            lengths[request] += len(added)
        elif op == "release":
            tree.release(paths.pop(request))
            arrays.release(cache.nodes, cache.lru, cache.cs, cache.path, cache.at(request), lengths.pop(request))
        else:
            assert arrays.evict(cache.nodes, cache.lru, cache.cs, units) == tree.evict(units)
        assert (cache.cs[arrays.CACHED], cache.cs[arrays.EVICTABLE]) == (tree.cached_units, tree.evictable_units)
        assert cache.cs[arrays.LRU_SIZE] <= len(cache.lru)
