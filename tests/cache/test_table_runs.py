"""Table.target_many (the compiled table over a run of blocks as numpy columns) answers what
Table.target answers block by block: for every pool's table, runs of one state (the usual
run, taken with one comparison) and of mixed states, every event, random record fields (small
values, so guards pass and fail); ``distinct``, the runs' distinct states, is the sorted set."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.cache.tables import REFUSED, distinct
from hybridkv.layout import ModelLayout

MANAGER = CacheManager(ModelLayout.v4_mini(), num_blocks=8, device="meta")
POOLS = sorted(MANAGER.pools)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_target_many_is_target_of_each_block(data):
    pool = MANAGER.pools[data.draw(st.sampled_from(POOLS))]
    table, rec_type = pool.table, pool.rec_type
    states = sorted(table.states)
    events = sorted({event for _, event in table.rows})
    n = data.draw(st.integers(1, 40))
    one_state = data.draw(st.booleans())
    first = data.draw(st.sampled_from(states))
    recs = []
    for _ in range(n):
        state = first if one_state else data.draw(st.sampled_from(states))
        fields = data.draw(st.lists(st.integers(0, 3), min_size=len(rec_type._fields) - 1,
                                    max_size=len(rec_type._fields) - 1))
        recs.append(rec_type(state, *fields))
    event = data.draw(st.sampled_from(events))
    cols = rec_type._make(np.asarray(recs, dtype=np.int64).T)
    got = table.target_many(cols.st, event, cols, pool.ctx).tolist()
    want = [table.target(r.st, event, r, pool.ctx) for r in recs]
    assert got == [REFUSED if t is None else t for t in want]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 40), max_size=30))
def test_distinct_is_the_sorted_set_of_the_column(values):
    got = distinct(np.asarray(values, dtype=np.int64))
    assert got == sorted(set(values)) and all(type(v) is int for v in got)
