"""CacheManager + DiskTier: spill on eviction, lookups that report disk copies without
reusing them, verified loads into preallocated blocks, faults as misses, in-flight loads,
salt isolation across tiers, restart."""
import os
import threading

import pytest
import torch

from hybridkv.disk import CostModel, DiskTier, FlopsModel, HookedBackend, LocalBackend
from hybridkv.disk.backend import fail_on, gate
from hybridkv.manager import CacheManager
from spec.common import FREE, LOADING, READY
from tests.runtime_helpers import LAY, P40 as P, run

EXT = P + [1, 2, 3]                       # a longer prompt: may resume at 40


def mk(path, n=12, backend=None, **kw):
    tier = DiskTier(path, capacity_bytes=1 << 26, backend=backend)
    return CacheManager(LAY, num_blocks=n, checked=True, disk=tier, **kw)


def pattern(ikey, kind, shape, dtype):
    g = torch.Generator().manual_seed(int.from_bytes(ikey[:6], "little") ^ sum(kind.encode()))
    return torch.randn(shape, generator=g).to(dtype)


def stamp(m):
    """Write a pattern derived from each published object's key into its block."""
    for (kind, g), pool in m.pools.items():
        for b, ikey in m.index.key_of[(kind, g)].items():
            v = pool.view(b)
            v.copy_(pattern(ikey, kind, v.shape, v.dtype))


def peek(m, rid, tokens, salt=b""):
    """A lookup whose request is then forgotten (it holds nothing)."""
    plan = m.lookup(rid, tokens, salt=salt)
    del m.reqs[rid]
    return plan


def push_out(m, salt=b""):
    """Run other prompts until P's checkpoint at 40 is partly evicted (spilled)."""
    for j in range(30):
        run(m, f"q{j}", [(11 * i + 13 * j + 1) % 250 for i in range(40)])
        plan = peek(m, "probe", EXT, salt)
        if plan.reuse_tokens < 40:
            return plan
    raise AssertionError("nothing was evicted")


def spilled_and_evicted(tmp_path, **kw):
    m = mk(tmp_path, **kw)
    run(m, "a", P)
    stamp(m)
    assert peek(m, "b", EXT).reuse_tokens == 40
    return m, push_out(m)


def test_spill_on_evict_then_reuse_only_after_verified_load(tmp_path):
    m, plan = spilled_and_evicted(tmp_path)
    assert m.stats()["disk"]["spilled"] >= len(plan.disk) > 0
    assert plan.disk_tokens == 40 and plan.disk_choice == "load"
    assert plan.reason == "3:disk" and set(plan.disk_groups) == {r.group for r in plan.disk}
    on_disk = {(r.kind, r.group, r.ikey) for r in plan.disk}
    for r in plan.reads:                          # disk copies are never reads before a load
        assert (r.ref.kind, r.ref.group, m.index.key_of[(r.ref.kind, r.ref.group)]
                [r.ref.block]) not in on_disk
    m.lookup("b", EXT)
    assert m.prefetch("b") == len(plan.disk)
    assert m.wait_loads() == 0
    again = m.lookup("b", EXT)
    assert again.reuse_tokens == 40 and again.disk == () and again.disk_tokens == 0
    for r in plan.disk:                           # the bytes that were spilled came back
        b = m.index.get(r.kind, r.group, r.ikey)
        pool = m.pools[(r.kind, r.group)]
        assert pool.recs[b].st == READY
        v = pool.view(b)
        assert torch.equal(v, pattern(r.ikey, r.kind, v.shape, v.dtype))
    m.allocate("b", 3)
    m.commit("b", 3)
    m.begin_read("b")
    m.free("b")
    assert m.stats()["disk"]["load_verified"] == len(plan.disk)


def _flip(path, where):
    for f in os.listdir(path):
        if not f.endswith(".hkv"):
            continue
        fp = os.path.join(path, f)
        data = bytearray(open(fp, "rb").read())
        if where == "truncate":
            data = data[:len(data) - 100]
        elif where == "header":
            data[20] ^= 0x10
        else:
            data[-5] ^= 0x01
        if where == "missing":
            os.remove(fp)
        else:
            open(fp, "wb").write(bytes(data))


@pytest.mark.parametrize("fault", ["payload", "header", "truncate", "missing"])
def test_damaged_copy_is_a_miss_then_recompute(tmp_path, fault):
    m, plan = spilled_and_evicted(tmp_path)
    assert plan.disk_tokens == 40
    _flip(tmp_path, fault)
    m.lookup("b", EXT)
    started = m.prefetch("b")
    assert started == len(plan.disk)
    assert m.wait_loads() == 0
    st = m.stats()["disk"]
    assert st["load_miss"] == started and st["load_verified"] == 0
    for r in plan.disk:                           # invalidated: neither published nor on disk
        assert m.index.get(r.kind, r.group, r.ikey) is None
        assert m.disk.state(r.key) == "absent"
    assert all(rec.st != LOADING for p in m.pools.values() for rec in p.recs)
    again = m.lookup("b", EXT)
    assert again.reuse_tokens < 40 and again.disk_tokens == 0
    m.allocate("b", len(EXT) - again.reuse_tokens)     # recompute the rest
    m.commit("b", len(EXT) - again.reuse_tokens)
    m.free("b")
    assert peek(m, "c", EXT + [9, 9]).reuse_tokens == 42


def reads_held(tmp_path):
    """spilled_and_evicted with every disk read held until the returned event is set."""
    ev = threading.Event()
    m, plan = spilled_and_evicted(
        tmp_path, backend=HookedBackend(LocalBackend(str(tmp_path)), gate("read", ev)))
    return m, plan, ev


def test_in_flight_load_is_not_reused(tmp_path):
    m, plan, ev = reads_held(tmp_path)
    try:
        m.lookup("b", EXT)
        n = m.prefetch("b")
        assert n == len(plan.disk) and m.disk_transit() == n
        assert m.stats()["in_transit"] >= n
        loading = [b for p in m.pools.values() for b, r in enumerate(p.recs) if r.st == LOADING]
        assert len(loading) == n
        busy = m.lookup("b", EXT)
        assert busy.reuse_tokens < 40 and busy.disk_tokens == 40
        assert busy.disk_choice == "wait" and {r.state for r in busy.disk} == {"loading"}
        m.disk.cost_model = CostModel(1.0, 1e18, FlopsModel(1000, 5, 64))   # 1 B/s disk
        assert peek(m, "c", EXT).disk_choice == "recompute"
        m.disk.cost_model = None
    finally:
        ev.set()
    assert m.wait_loads() == 0
    assert m.lookup("b", EXT).reuse_tokens == 40


def test_cost_model_picks_recompute_for_a_slow_disk(tmp_path):
    m, plan = spilled_and_evicted(tmp_path)
    m.disk.cost_model = CostModel(1.0, 1e18, FlopsModel(1000, 5, 64))
    slow = peek(m, "b", EXT)
    assert slow.disk_choice == "recompute" and set(slow.disk_groups.values()) == {"recompute"}
    m.disk.cost_model = CostModel(1e12, 1.0, FlopsModel(10 ** 9, 5, 64))
    assert peek(m, "b", EXT).disk_choice == "load"


def test_spill_io_error_only_loses_the_copy(tmp_path):
    m = mk(tmp_path, backend=HookedBackend(LocalBackend(str(tmp_path)), fail_on("put")))
    run(m, "a", P)
    plan = push_out(m)                            # evictions proceed; spills fail quietly
    st = m.stats()["disk"]
    assert st["spill_failed"] > 0 and st["spilled"] == 0
    assert plan.disk == () and plan.disk_tokens == 0
    assert all(rec.st != FREE or rec.pins == 0 for p in m.pools.values() for rec in p.recs)


def _restart(tmp_path, salt):
    m = mk(tmp_path, n=24)
    run(m, "a", P, salt=b"tenant-A")
    stamp(m)
    assert m.spill_all() > 0
    m.disk.close()
    m2 = mk(tmp_path, n=24)
    return m2, m2.lookup("b", EXT, salt=salt)


def test_restart_hits_spilled_prefix_with_same_salt(tmp_path):
    m2, plan = _restart(tmp_path, b"tenant-A")
    assert plan.reuse_tokens == 0 and plan.disk_tokens == 40 and plan.disk_choice == "load"
    assert {g.name for g in LAY.groups} == set(plan.disk_groups)
    assert m2.prefetch("b") == len(plan.disk) and m2.wait_loads() == 0
    hit = m2.lookup("b", EXT, salt=b"tenant-A")
    assert hit.reuse_tokens == 40
    for r in hit.reads:
        pool = m2.pools[(r.ref.kind, r.ref.group)]
        ikey = m2.index.key_of[(r.ref.kind, r.ref.group)][r.ref.block]
        v = pool.view(r.ref.block)
        assert torch.equal(v, pattern(ikey, r.ref.kind, v.shape, v.dtype))
    assert peek(m2, "c", EXT, b"tenant-B").reuse_tokens == 0


def test_salt_isolates_tenants_on_disk(tmp_path):
    m2, plan = _restart(tmp_path, b"tenant-B")
    assert plan.reuse_tokens == 0 and plan.disk == () and plan.disk_tokens == 0
    assert peek(m2, "c", EXT).disk_tokens == 0               # no salt: no hit either
    assert peek(m2, "d", EXT, b"tenant-A").disk_tokens == 40


def test_loads_beyond_the_tier_budget_queue_then_finish(tmp_path):
    m = mk(tmp_path, n=24)
    run(m, "a", P)
    m.spill_all()
    m.disk.close()
    ev = threading.Event()
    gated = HookedBackend(LocalBackend(str(tmp_path)), gate("read", ev))
    ev.set()                                      # the restart reads headers freely
    m2 = CacheManager(LAY, num_blocks=24, checked=True, disk=DiskTier(
        tmp_path, capacity_bytes=1 << 26, max_in_flight=2, backend=gated))
    ev.clear()
    try:
        plan = m2.lookup("b", EXT)
        assert len(plan.disk) > 2
        assert m2.prefetch("b") == len(plan.disk)
        st = m2.stats()["disk"]
        assert st["loads_in_flight"] == 2 == m2.disk.in_flight
        assert st["loads_queued"] == len(plan.disk) - 2
    finally:
        ev.set()
    assert m2.wait_loads() == 0
    assert m2.lookup("b", EXT).reuse_tokens == 40


def test_checked_mode_catches_a_load_into_the_wrong_block(tmp_path):
    from hybridkv.errors import InvariantViolation
    m, plan, ev = reads_held(tmp_path)
    try:
        m.lookup("b", EXT)
        m.prefetch("b")
        key, ld = next(iter(m.disk_link.loads.items()))
        pool = m.pools[(ld.ref.kind, ld.ref.group)]
        other = next(b for b, r in enumerate(pool.recs) if r.st != LOADING)
        m.disk_link.loads[key] = ld._replace(ref=ld.ref._replace(block=other))
        with pytest.raises(InvariantViolation):
            m.check_invariants()
        m.disk_link.loads[key] = ld
        m.check_invariants()
    finally:
        ev.set()
    assert m.wait_loads() == 0


def test_indexer_copy_of_old_version_is_not_offered(tmp_path):
    m2, plan = _restart(tmp_path, b"tenant-A")
    assert plan.disk_tokens == 40
    del m2.reqs["b"]
    m2.bump_indexer_version()                     # new indexer weights: old copies are other
    again = peek(m2, "b", EXT, b"tenant-A")
    assert again.disk_tokens == 0 and not any(r.kind == "idx" for r in again.disk)


def test_plan_evicted_between_lookup_and_allocate_is_resized(tmp_path):
    m = mk(tmp_path)
    run(m, "a", P)
    assert m.lookup("b", EXT).reuse_tokens == 40      # b holds a plan, not yet taken
    for j in range(30):                               # other requests evict b's objects
        run(m, f"q{j}", [(11 * i + 13 * j + 1) % 250 for i in range(40)])
        if peek(m, "probe", EXT).reuse_tokens < 40:
            break
    fresh = peek(m, "probe", EXT).reuse_tokens
    assert fresh < 40
    alloc = m.allocate("b", len(EXT) - fresh)          # sized from the current plan
    assert (alloc.start, alloc.end) == (fresh, len(EXT))
    m.commit("b", len(EXT) - fresh)
    m.free("b")
