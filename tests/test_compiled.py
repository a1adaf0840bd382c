"""The compiled loops sum and sort as numpy does, so features and schedules do not depend on which of the two
computed them."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.compiled import pairwise_sum, stable_argsort


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e12, 1e12), max_size=700), st.integers(0, 20))
def test_pairwise_sum_is_numpys_sum_bit_for_bit(values, skip):
    array = np.array(values, dtype=np.float64)
    start = min(skip, len(array))
    assert pairwise_sum(array, start, len(array) - start) == array[start:].sum()


def test_pairwise_sum_rounds_as_numpy_on_long_runs_where_order_matters():
    rng = np.random.default_rng(0)
    for count in (7, 8, 127, 128, 129, 1000, 4097, 100_003):
        values = rng.random(count) * 10.0 ** rng.uniform(-3, 12, count)
        in_order = np.add.accumulate(values)[-1]
        assert pairwise_sum(values, 0, count) == values.sum()
        if count > 1000:
            assert values.sum() != in_order  # the test would not tell the two orders apart otherwise


def test_pairwise_sum_of_nothing_or_negative_zeros_is_positive_zero():
    for values in (np.zeros(0), np.array([-0.0]), np.full(9, -0.0), np.full(200, -0.0)):
        total = pairwise_sum(values, 0, len(values))
        assert total == 0.0 and not np.signbit(total)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, 3.0, 1e9]) | st.floats(-1e6, 1e6), max_size=300),
       st.booleans())
def test_stable_argsort_is_numpys_stable_argsort(values, descending):
    # Many ties (and zeros of both signs): a stable sort keeps equal values in index order, as numpy's does.
    array = np.array(values, dtype=np.float64)
    expected = np.argsort(-array if descending else array, kind="stable")
    assert np.array_equal(stable_argsort(array, descending), expected)
