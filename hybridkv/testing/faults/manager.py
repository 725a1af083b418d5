"""Fault-matrix rows with the cache manager on top of the tier (issue 15): what gets through a
CacheManager + DiskTier when loads are slow, plans are forged, or Redis hangs.

  bump_during_loads  an indexer version bump while verified loads are queued and in flight
                     (reads slowed to 30 ms, the request that asked already freed): wrong data
                     = an indexer block of the old version published, or reused, as current
  forged_plans       HitPlans naming another tenant's objects or an unknown group: wrong data
                     = a tenant hitting on another tenant's bytes; a malformed read must be a
                     named error with nothing queued
  hung_redis         redis-server stopped (SIGSTOP) with spills and loads in flight: every
                     manager call must still return promptly (goal < 50 ms; loads fall back)
Columns as in hybridkv.testing.faults.kit; every count must end at 0."""
import os
import signal
import time

from hybridkv.disk.backend import HookedBackend
from hybridkv.disk.format import DiskError
from hybridkv.disk.local import LocalBackend
from hybridkv.disk.redis_backend import RedisServer
from hybridkv.disk.tier import DiskTier
from hybridkv.errors import CacheError, Refused
from hybridkv.testing.faults.hooks import slow
from hybridkv.testing.faults.kit import Counter, FaultRow

GOAL_S = 0.05
P = [(7 * i + 3) % 250 for i in range(40)]
EXT = P + [1, 2, 3]
NAMED = (DiskError, CacheError)


def _serve(m, rid, toks, salt=b""):
    plan = m.lookup(rid, toks, salt=salt)
    a = m.allocate(rid, len(toks) - plan.reuse_tokens)
    L = a.start
    for P_ in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
        m.commit(rid, P_ - L)
        L = P_
    m.free(rid)


def _cache(tier, n=12):
    from hybridkv.cache import CacheManager
    from hybridkv.layout import ModelLayout
    return CacheManager(ModelLayout.v4_mini(), num_blocks=n, disk=tier)


def _spilled(m, salt=b""):
    """P served under ``salt``, then pushed out of memory (its blocks spilled)."""
    _serve(m, "a", P, salt)
    for j in range(30):
        _serve(m, f"q{j}", [(11 * i + 13 * j + 1) % 250 for i in range(40)])
        m.wait_loads(5.0)
        plan = m.lookup("probe", EXT, salt=salt)
        m.free("probe")
        if plan.reuse_tokens < 40 and plan.disk_tokens:
            return plan
    return None


def bump_during_loads(d, trials=6):
    c = Counter(named=NAMED)
    refused = done = 0
    for t in range(trials):
        root = os.path.join(d, str(t))
        slowed = HookedBackend(LocalBackend(root), slow("read", 0.03))
        tier = DiskTier(root, 1 << 26, backend=slowed)
        m = _cache(tier)
        if c.call(_spilled, m) is None:
            continue
        c.call(m.lookup, "b", EXT)
        c.call(m.prefetch, "b")
        c.call(m.free, "b")                      # the loads stay queued / in flight
        c.trials += 1
        try:
            m.bump_indexer_version()
            done += 1
        except Refused:                          # an indexer copy was already copying
            refused += 1
        c.call(m.wait_loads, 10.0)
        for (kind, g), pool in m.pools.items():
            if kind == "idx":
                c.wrong += sum(pool.recs[b].iv != m.miv for b in m.index.entries[(kind, g)])
        plan = c.call(m.lookup, "c", EXT)
        if plan is not None:
            c.wrong += sum(1 for r in plan.reads if r.ref.kind == "idx" and
                           m.pools[(r.ref.kind, r.ref.group)].recs[r.ref.block].iv != m.miv)
            c.call(m.free, "c")
        c.call(m.check_invariants)
        tier.close()
    return c.row("version bump with loads in flight (reads 30 ms)",
                 f"{done} bumps after dropping/cancelling indexer loads, {refused} refused "
                 "while a copy was in progress; no old-version indexer state published",
                 c.trials > 0)


def forged_plans(d, trials=6):
    c = Counter(named=NAMED)
    expected = True
    for t in range(trials):
        root = os.path.join(d, str(t))
        m = _cache(DiskTier(root, 1 << 26))
        plan_a = c.call(_spilled, m, b"A")
        if plan_a is None:
            continue
        plan_b = c.call(m.lookup, "b", EXT, b"B")
        forged = plan_b._replace(disk=plan_a.disk, disk_tokens=plan_a.disk_tokens)
        c.trials += 1
        c.call(m.prefetch, forged)               # loads A's objects under A's keys only
        c.call(m.wait_loads, 10.0)
        again = c.call(m.lookup, "b", EXT, b"B")
        c.wrong += bool(again and again.reuse_tokens)
        bad = plan_a._replace(disk=plan_a.disk + (plan_a.disk[0]._replace(group="nope"),))
        before = (len(m.disk_link.pending), len(m.disk_link.loads))
        try:
            m.prefetch(bad)
            expected = False                     # must be refused
        except CacheError:
            pass
        c.trials += 1
        expected &= (len(m.disk_link.pending), len(m.disk_link.loads)) == before
        c.call(m.free, "b")
        c.call(m.check_invariants)
        m.disk.close()
    return c.row("forged HitPlans (another tenant's objects, unknown group)",
                 "foreign reads loaded only under their own keys (no cross-tenant hit); a "
                 "malformed read refused (BadArgument) before anything was queued", expected)


def hung_redis(_d, rounds=10):
    if not RedisServer.available():
        return FaultRow("manager with a hung Redis", "skipped: no redis-server", 0, 0)
    c = Counter(deadline=5.0, named=NAMED)
    with RedisServer() as srv:
        m = _cache(DiskTier(capacity_bytes=1 << 26, backend=srv.backend(), workers=2), n=12)
        plan = c.call(_spilled, m)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            for j in range(rounds):
                c.timed(m.lookup, "b", EXT)
                if plan is not None:
                    c.timed(m.prefetch, "b")
                c.timed(m.poll_loads)
                c.timed(m.wait_loads, 0.0)
                c.timed(m.free, "b")
                c.timed(_serve, m, f"w{j}", [(5 * i + j) % 250 for i in range(24)])
                c.timed(m.stats)
            t0 = time.perf_counter()
            left = c.call(m.wait_loads, 0.3)         # waits without the lock, then returns
            waited = time.perf_counter() - t0
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        c.call(m.wait_loads, 10.0)
        c.call(m.check_invariants)
        m.disk.close()
    fast = c.max_seconds is not None and c.max_seconds < GOAL_S
    each = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(c.slowest.items()))
    return c.row("manager with a hung Redis (SIGSTOP)",
                 f"slowest manager call {(c.max_seconds or 0) * 1e3:.2f} ms (goal < "
                 f"{GOAL_S * 1e3:.0f} ms; ms per call: {each}); wait_loads(0.3) returned in "
                 f"{waited:.2f} s with {left} loads left", fast, trials=7 * rounds)


ROWS = (bump_during_loads, forged_plans, hung_redis)
