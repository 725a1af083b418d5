"""Indexer version bumps: outdated indexer objects are swept back to the free list through
the compiled tables (spec mark_stale, then drop_stale); pinned ones as soon as they are
unpinned.  A hit needs indexer objects of the new version afterwards."""
import pytest

from hybridkv.cache import CacheManager
from hybridkv.errors import Refused
from hybridkv.testing.driver import ObjectDriver
from spec import SysConfig
from spec.common import FREE, PINNED, READY, STALE
from tests.cache.helpers import LAY, P40, fingerprint, run

IDX = 3


def idx_blocks(m, st):
    return {(g, b) for (kind, g), p in m.pools.items() if kind == "idx"
            for b, r in enumerate(p.recs) if r.st == st}


def test_bump_sweeps_unheld_outdated_indexer_objects():
    m = CacheManager(LAY, num_blocks=48, checked=True, every_n=16)
    run(m, "a", P40)
    old = idx_blocks(m, READY)
    assert old and all(m.pools[("idx", g)].recs[b].iv == 0 for g, b in old)
    other = {pk: tuple(p.recs) for pk, p in m.pools.items() if pk[0] != "idx"}
    m.bump_indexer_version()
    assert all(m.pools[("idx", g)].recs[b].st == FREE for g, b in old)
    assert not idx_blocks(m, STALE) and not idx_blocks(m, READY)
    assert not any(m.index.entries[pk] for pk in m.pools if pk[0] == "idx")   # unpublished
    assert not any(m.evictor.cached[pk] for pk in m.pools if pk[0] == "idx")
    t = m.metrics.transitions               # through the tables, one each per swept block
    assert sum(n for (k, a, b), n in t.items() if k == "idx" and (a, b) == (READY, STALE)) == \
        len(old)
    assert sum(n for (k, a, b), n in t.items() if k == "idx" and (a, b) == (STALE, FREE)) == \
        len(old)
    assert {pk: tuple(p.recs) for pk, p in m.pools.items() if pk[0] != "idx"} == other
    m.check_invariants()
    assert run(m, "b", P40 + [1]).reuse_tokens < 40      # the old prefix no longer hits
    assert run(m, "c", P40 + [2]).reuse_tokens == 40     # rebuilt with the new indexer
    assert all(m.pools[("idx", g)].recs[b].iv == 1 for g, b in idx_blocks(m, READY))


def test_pinned_outdated_indexer_is_swept_when_unpinned():
    mgr = CacheManager.for_spec(SysConfig(n_obj=2), checked=True)
    drv = ObjectDriver(mgr)
    for i in (0, 1):
        for name in ("write", "fill", "publish", "seal"):
            drv.do(name, (IDX, i, 2) if name == "write" else (IDX, i))
    drv.do("spill_start", (0, IDX, 1))          # a disk spill holds object 1
    pool = mgr.pools[("idx", "g")]
    assert [r.st for r in pool.recs] == [READY, PINNED]
    mgr.bump_indexer_version()
    assert [r.st for r in pool.recs] == [FREE, PINNED]   # held: not swept yet
    mgr.check_invariants()
    drv.do("spill_done", (0, IDX))              # the last pin goes
    assert pool.recs[1].st == FREE and pool.recs[1].ver == 1   # drop_stale re-versions
    mgr.check_invariants()


@pytest.mark.parametrize("held", ["looked_up", "allocated"])
def test_bump_refused_while_a_request_is_registered_changes_nothing(held):
    m = CacheManager(LAY, num_blocks=48, checked=True)
    run(m, "a", P40)
    m.lookup("x", P40 + [1])
    if held == "allocated":
        m.allocate("x", 1)
    before = fingerprint(m)
    with pytest.raises(Refused) as e:
        m.bump_indexer_version()
    assert e.value.value["requests_in_flight"] == 1
    assert fingerprint(m) == before and m.miv == 0
