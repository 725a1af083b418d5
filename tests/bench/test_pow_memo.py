"""PowMemo: a float column's ``x ** weight`` with the bits Python's ``pow`` gives each value,
call after call, as values are kept, past the cap, across a weight change."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.pow_memo import PowMemo

VALUES = st.one_of(st.floats(min_value=0.0, max_value=1e12), st.sampled_from(
    [0.0, -0.0, math.inf, math.nan, 5e-324, 1.0, 0.1, 3.0, 1e-300]))
COLUMNS = st.lists(st.lists(VALUES, max_size=40), min_size=1, max_size=6)


def bits(col):
    """Each value's bit pattern, every NaN as one pattern."""
    arr = np.asarray(col, dtype=np.float64)
    return np.where(np.isnan(arr), -1, arr.view(np.int64)).tolist()


@settings(max_examples=200, deadline=None)
@given(COLUMNS, st.sampled_from([0.25, 1.0, 0.5, 3.0]), st.sampled_from([4, 1 << 16]))
def test_every_column_has_python_pows_bits(columns, weight, cap):
    memo = PowMemo(weight, cap)
    for col in columns + columns[::-1]:          # each column again, its values kept now
        got = memo(np.asarray(col, dtype=np.float64), weight)
        assert bits(got) == bits([pow(x, weight) for x in col])
        assert len(memo.keys) <= cap and (np.diff(memo.keys) > 0).all()


def test_kept_values_are_read_back_and_a_weight_change_starts_over():
    memo = PowMemo(0.25)
    col = np.arange(1.0, 101.0)
    memo(col, 0.25)
    assert len(memo.keys) == 100
    memo.vals[:] = -1.0                            # a kept value is what the next call returns
    assert (memo(col, 0.25) == -1.0).all()
    got = memo(col, 0.5)                           # another weight: none of those values
    assert bits(got) == bits([pow(x, 0.5) for x in col.tolist()])
    assert bits(memo.vals) == bits([pow(x, 0.5) for x in col.tolist()])


def test_zeros_and_nan_are_never_kept():
    memo = PowMemo(1.0)
    got = memo(np.array([0.0, -0.0, math.nan, 2.0]), 1.0)
    assert bits(got) == bits([0.0, -0.0, math.nan, 2.0])       # pow(-0.0, 1.0) is -0.0
    assert memo.keys.tolist() == [2.0]
    got = memo(np.array([-0.0, 0.0]), 1.0)
    assert bits(got) == bits([-0.0, 0.0])
