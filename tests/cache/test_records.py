"""A pool's records as columns (RecordColumns) and its one ObjRef per block (block_refs)."""
import numpy as np
import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.records import RecordColumns
from hybridkv.errors import BadArgument
from hybridkv.layout import ModelLayout
from spec.common import PINNED, READY
from spec.compressed import CompRec
from tests.cache.helpers import P40, mk, run


def test_a_row_reads_and_writes_as_the_spec_record():
    recs = RecordColumns(CompRec, 5)
    assert list(recs) == [CompRec()] * 5 and len(recs) == 5
    rec = CompRec(st=READY, ver=3, pins=0, ep=1, draft=0, pub=1, h=64, closed=16)
    recs[2] = rec
    got = recs[2]
    assert got == rec and type(got) is CompRec and all(type(v) is int for v in got)
    assert (recs.state(2), recs.value(2, "h"), recs.value(2, "ver")) == (READY, 64, 3)
    assert recs[1] == CompRec()                    # the neighbours did not move
    with pytest.raises(BadArgument):
        recs.put(3, tuple(rec))                    # a plain tuple is not a CompRec
    assert recs[3] == CompRec()


def test_a_run_gathers_and_scatters_only_its_rows():
    recs = RecordColumns(CompRec, 6)
    for b in range(6):
        recs[b] = CompRec(st=READY, ver=b, pins=0, ep=0, draft=0, pub=1, h=16 * b, closed=4 * b)
    idx, o = recs.gather([4, 1])
    assert o.ver.tolist() == [4, 1] and o.h.tolist() == [64, 16]
    recs.scatter(idx, o._replace(st=PINNED, pins=o.pins + 1), o)
    assert [recs.state(b) for b in range(6)] == [READY, PINNED, READY, READY, PINNED, READY]
    assert recs[4] == CompRec(st=PINNED, ver=4, pins=1, ep=0, draft=0, pub=1, h=64, closed=16)
    assert recs.values([5, 4, 0], "pins") == [0, 1, 0]
    o.h[:] = 0                                     # gather handed out a copy
    assert recs.value(1, "h") == 16


def test_a_scatter_given_the_gathered_columns_writes_the_changed_fields_alone():
    """``scatter(idx, new, olds)``: the fields an effect set (new columns, or scalars) are
    written, the ones it kept (the gathered column itself) are not -- the rows end as writing
    each block's new record whole leaves them."""
    def filled():
        recs = RecordColumns(CompRec, 6)
        for b in range(6):
            recs[b] = CompRec(st=READY, ver=b, pins=b % 2, ep=0, draft=0, pub=1, h=16 * b,
                              closed=4 * b)
        return recs
    whole, changed = filled(), filled()
    for b in (5, 0, 3):
        whole[b] = whole[b]._replace(st=PINNED, pins=whole[b].pins + 1, draft=0, h=7)
    idx, o = changed.gather([5, 0, 3])
    changed.scatter(idx, o._replace(st=PINNED, pins=o.pins + 1, draft=0, h=7), o)
    assert list(changed) == list(whole)
    assert changed[3] == CompRec(st=PINNED, ver=3, pins=2, ep=0, draft=0, pub=1, h=7,
                                 closed=12)
    assert changed[2] == CompRec(st=READY, ver=2, pins=0, ep=0, draft=0, pub=1, h=32, closed=8)
    idx, o = changed.gather([1, 2])
    o.ver[:] = 99                                  # a kept column is never written back
    changed.scatter(idx, o._replace(pub=0), o)
    assert changed.values([1, 2], "ver") == [1, 2] and changed.values([1, 2], "pub") == [0, 0]


def test_load_replaces_every_record_or_nothing():
    recs = RecordColumns(CompRec, 3)
    new = [CompRec(st=READY, ver=i) for i in range(3)]
    recs.load(new)
    assert list(recs) == new
    for bad in (new[:2], new[:2] + [tuple(new[2])]):
        with pytest.raises(BadArgument):
            recs.load(bad)
        assert list(recs) == new
    assert recs.cols.dtype == np.int64


def test_index_requests_and_evictor_share_the_pools_one_ref_per_block():
    """A block's ObjRef is made once (block_refs) and every structure that names the block holds
    that very object (index parents, checkpoint anchors); a request's reads keep the block ids
    alone (hybridkv.cache.reads) and name the same refs."""
    m = mk(checked=False)
    run(m, "a", P40)
    run(m, "b", P40 + [1, 2, 3], free=False)
    seen = 0
    for pk, ents in m.index.entries.items():
        refs = m.pools[pk].refs
        for b, e in ents.items():
            if e.parent is not None:
                assert e.parent is refs[e.parent.block]
                seen += 1
    for ck in m.index.ckpts.values():
        for a in ck.anchors:
            assert a is m.pools[(a.kind, a.group)].refs[a.block]
            seen += 1
    for pk, taken in m.requests["b"].reads.runs():    # a request keeps block ids, no refs
        assert taken.blocks and all(type(b) is int for b in taken.blocks)
        assert [r.ref for r in taken] == [m.pools[pk].refs[b] for b in taken.blocks]
        seen += len(taken)
    assert seen > 10
    pool = next(iter(m.pools.values()))
    assert pool.refs[7] == ObjRef(pool.kind, pool.group, 7) and pool.refs[7] is pool.refs[7]


def test_values_of_a_long_and_a_short_run_read_the_same_rows():
    recs = RecordColumns(CompRec, 80)
    for b in range(80):
        recs[b] = CompRec(st=READY, ver=b % 7, pins=0, ep=b, draft=0, pub=b % 2, h=b, closed=0)
    long_run = list(range(79, 20, -1))             # numpy gather
    assert len(long_run) >= 32
    assert recs.values(long_run, "ep") == [recs.value(b, "ep") for b in long_run] == long_run
    assert recs.values([3, 9, 3], "ver") == [3, 2, 3]          # read one by one
    assert all(type(v) is int for v in recs.values(long_run, "pub"))


def test_construction_makes_every_blocks_objects_and_leaves_the_collector_as_it_found_it(
        monkeypatch):
    """Every block's ObjRef and index entry exist once the manager is built (nothing is made
    lazily during a stream); the collector, paused while they are made, is back on -- or still
    off when the host had turned it off, and back on when construction fails part way."""
    import gc

    from hybridkv.cache import manager as manager_mod
    m = mk(checked=False)
    for pk, pool in m.pools.items():
        assert len(pool.refs) == pool.n and len(m.index.made[pk]) == pool.n
        assert len({id(e) for e in m.index.made[pk]}) == pool.n
    assert gc.isenabled()
    gc.disable()
    try:
        mk(checked=False)
        assert not gc.isenabled()
    finally:
        gc.enable()

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(manager_mod, "PrefixIndex", broken)
    with pytest.raises(RuntimeError):
        mk(checked=False)
    assert gc.isenabled()


def test_reads_seeded_from_read_records_keep_each_pools_order_and_every_field():
    """``Reads(records)`` (a plan's reads, pools interleaved) holds per pool the records in
    the order given, every field in its column, and yields them back as they were."""
    from hybridkv.cache.funnel import Read
    from hybridkv.cache.reads import Reads
    a, b = ("comp", "g0"), ("swa", "g0")
    records = [Read(ObjRef(*a, 5), 16, 1, 0), Read(ObjRef(*a, 2), 32, 3, 1),
               Read(ObjRef(*b, 7), 32, 0, 2, True), Read(ObjRef(*a, 9), 48, 2, 0)]
    reads = Reads(records)
    assert len(reads) == 4 and bool(reads) and not Reads()
    runs = dict(reads.runs())
    assert list(runs) == [a, b]
    assert (runs[a].blocks, runs[a].at, runs[a].ver, runs[a].ep, runs[a].exact) == \
        ([5, 2, 9], [16, 32, 48], [1, 3, 2], [0, 1, 0], [False, False, False])
    assert (runs[b].blocks, runs[b].exact) == ([7], [True])
    assert list(reads) == [records[0], records[1], records[3], records[2]]


def test_a_plans_reads_are_its_own_after_the_request_takes_them():
    """The first allocation copies the plan's read columns into the request's reads
    (``Reads.copy``): the blocks the request seals later join the request's reads, never the
    plan's, and the copy compares equal to the plan until then; ``exact_refs`` names a hit's
    snapshots."""
    from hybridkv.cache.reads import Reads
    lay = ModelLayout.full(block_size=4, window=8)
    m = CacheManager(lay, num_blocks=200)
    prompt = [(11 * i + 5) % 200 for i in range(60)]
    m.lookup("a", prompt)
    a = m.allocate("a", len(prompt))
    m.commit("a", a.end - a.start)
    m.free("a")
    plan = m.lookup("b", prompt + [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert plan.reuse_tokens and isinstance(plan.reads, Reads)
    before = plan.reads.copy()
    assert before == plan.reads and before is not plan.reads
    assert [r.kind for r in plan.reads.exact_refs()] == ["swa"]
    assert plan.reads.exact_refs() == [r.ref for r in plan.reads if r.exact]
    a = m.allocate("b", 9)
    assert m.requests["b"].reads == plan.reads
    m.commit("b", 9, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(m.requests["b"].reads) > len(plan.reads)        # sealed blocks joined
    assert plan.reads == before                                  # the plan's did not change
