"""A hit's first allocation re-checks its plan pool by pool (``CacheManager._check_plan``:
the table once over each run of reads, versions and epochs compared as lists): StaleRead names
the first read in the plan's order that is no longer pinnable or moved, exactly as checking the
reads one by one does, and nothing changes; the blocks the hit holds back from eviction are
counted the same way (``Admission.held_back``)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.cache import CacheManager
from hybridkv.errors import StaleRead
from hybridkv.layout import ModelLayout
from spec.common import LOADING, READY
from tests.cache.helpers import fingerprint

FULL = ModelLayout.full(block_size=4, window=8)     # a chain run and a window snapshot
PROMPT = [(11 * i + 5) % 200 for i in range(120)]   # 30 chain blocks: past the table's run


def cached_prompt():
    m = CacheManager(FULL, num_blocks=160, checked=True)
    m.lookup("a", PROMPT)
    a = m.allocate("a", len(PROMPT))
    m.commit("a", a.end - a.start)
    m.free("a")
    return m


def first_stale_one_by_one(m, plan):
    """The read the plan check must name: the first not pinnable or moved, one by one."""
    for r in plan.reads:
        pool = m.pools[(r.ref.kind, r.ref.group)]
        rec = pool.recs[r.ref.block]
        if pool.target(r.ref.block, "pin") is None or (rec.ver, rec.ep) != (r.ver, r.ep):
            return tuple(r.ref)
    return None


@settings(max_examples=40, deadline=None)
@given(moved=st.sets(st.integers(0, 200)), dropped=st.sets(st.integers(0, 200), max_size=2),
       loading=st.sets(st.integers(0, 200), max_size=2))
def test_the_first_changed_read_in_plan_order_is_named_and_nothing_changes(moved, dropped,
                                                                           loading):
    m = cached_prompt()
    plan = m.lookup("b", PROMPT + [1, 2])
    reads = list(plan.reads)             # Read records, in the plan's order
    assert plan.reuse_tokens and len(reads) > 24
    kept = {reads[j % len(reads)].ref for j in dropped}
    for i in sorted(moved):
        if reads[i % len(reads)].ref not in kept:
            m.relocate(*reads[i % len(reads)].ref)
    for j in sorted(dropped):           # a block dropped (bytes gone bad): not pinnable
        r = reads[j % len(reads)]
        if m.pools[(r.ref.kind, r.ref.group)].target(r.ref.block, "evict") is not None:
            m.evictor.drop(r.ref)
    for j in loading:                   # a state pin is refused from, version and epoch
        r = reads[j % len(reads)]       # kept (set by hand: the table's check alone sees it)
        pool = m.pools[(r.ref.kind, r.ref.group)]
        if pool.recs[r.ref.block].st == READY:
            pool.recs.put(r.ref.block, pool.recs[r.ref.block]._replace(st=LOADING))
    want = first_stale_one_by_one(m, plan)
    before = fingerprint(m)
    if want is None:
        m.allocate("b", 2)
        got = list(m.requests["b"].reads)       # kept per pool (cache/reads.py): each
        assert sorted(got) == sorted(reads)     # pool's reads in the plan's order
        for pk in {r.ref[:2] for r in reads}:
            assert [r for r in got if r.ref[:2] == pk] == [r for r in reads if r.ref[:2] == pk]
        return
    with pytest.raises(StaleRead) as err:
        m.allocate("b", 2)
    assert err.value.value == want
    assert fingerprint(m) == before
    if not loading:
        m.check_invariants()


def test_a_hit_holds_back_what_its_reads_would_leave_to_eviction():
    m = cached_prompt()
    plan = m.lookup("b", PROMPT + [1, 2])
    want = {}
    for r in plan.reads:
        if m.evictor.takeable(r.ref):
            pk = (r.ref.kind, r.ref.group)
            want[pk] = want.get(pk, 0) + 1
    assert m.admission.held_back(plan.reads) == want and sum(want.values()) >= 30
