"""Fault-matrix rows that need other processes or a Redis server: a writer killed between
write and rename, two processes racing on one key, Redis lost mid-load, two processes of
different format versions sharing a directory.  Children are started with the
multiprocessing "spawn" method (fresh interpreters, no shared state)."""
import multiprocessing as mp
import os
import queue
import tempfile
import time

import torch

from hybridkv.disk import format as fmt
from hybridkv.disk.backend import HookedBackend
from hybridkv.disk.loader import LoadStatus
from hybridkv.disk.local import FileOps, LocalBackend
from hybridkv.disk.redis_backend import RedisServer
from hybridkv.disk.tier import DiskTier
from hybridkv.testing.faults.files import LOCAL
from hybridkv.testing.faults.kit import META, Counter, FaultRow, key_for, payload
from hybridkv.testing.faults.tier import TIER, redis_full

CRASH_CODE = 70


class _DieBeforeRename(FileOps):
    def replace(self, src, dst):
        os._exit(CRASH_CODE)       # the process dies with the fsynced temp file in place


def _crashing_writer(d, i):
    tier = DiskTier(d, 1 << 24, backend=LocalBackend(d, _DieBeforeRename()))
    tier.spill(key_for(i), payload(i), META)
    os._exit(0)                    # not reached


def _racing_writer(d, i, fill, rounds, barrier):
    tier = DiskTier(d, 1 << 26)
    x = torch.full((256, 256), float(fill))
    barrier.wait(60)
    for _ in range(rounds):
        tier.discard(key_for(i))   # delete + republish: renames and unlinks race the reader
        tier.spill(key_for(i), x, META)
    tier.close()


def crash_before_rename(d):
    c, ctx = Counter(), mp.get_context("spawn")
    p = ctx.Process(target=_crashing_writer, args=(d, 5))
    p.start()
    p.join(60)
    c.hangs += _reap(p)
    temps = [f for f in os.listdir(d) if f.startswith(".tmp-")]
    tier = c.call(DiskTier, d, 1 << 24)
    swept = tier.stats["temp_swept"] if tier else 0
    r = c.load(tier, key_for(5), payload(5)) if tier else None
    s = c.call(tier.spill, key_for(5), payload(5), META) if tier else None
    r2 = c.load(tier, key_for(5), payload(5)) if tier else None
    ok = (p.exitcode == CRASH_CODE and len(temps) == 1 and swept == 1 and r is not None
          and r.status is LoadStatus.MISS and s and s.ok and r2 and r2.ok)
    return c.row("crash between write and rename",
                 f"writer died (exit {p.exitcode}) leaving {len(temps)} temp file; restart "
                 f"swept {swept}, key absent -> miss; respill + load {r2 and r2.status.value}",
                 ok)


def two_process_race(d, rounds=40):
    """Two writer processes publish different bytes under one key (delete, rewrite, rename)
    while this process loads it over and over: each load is a miss or one whole version."""
    c, ctx = Counter(), mp.get_context("spawn")
    a, b = torch.full((256, 256), 1.0), torch.full((256, 256), 2.0)
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_racing_writer, args=(d, 6, v, rounds, barrier))
             for v in (1, 2)]
    for p in procs:
        p.start()
    tier, n, hits, reasons = DiskTier(d, 1 << 26), 0, 0, set()
    barrier.wait(60)
    deadline = time.monotonic() + 120
    while (any(p.is_alive() for p in procs) or n < 20) and time.monotonic() < deadline:
        c.call(tier.refresh)       # adopt what the writers published (as the manager does)
        r = c.load(tier, key_for(6), a, allowed=(a, b))
        n += 1
        hits += bool(r and r.ok)
        if r is not None and not r.ok:
            reasons.add(r.reason)
    for p in procs:
        p.join(30)
        c.hangs += _reap(p)
    c.crashes += sum(p.exitcode != 0 for p in procs)
    final = c.load(DiskTier(d, 1 << 26), key_for(6), a, allowed=(a, b))
    ok = final is not None and final.ok and all(p.exitcode == 0 for p in procs)
    return c.row("two processes racing on one key",
                 f"{n} concurrent loads: {hits} verified whole versions, {n - hits} misses "
                 f"{sorted(reasons)}; "
                 f"writers exited {[p.exitcode for p in procs]}; final load "
                 f"{final and final.status.value}", ok)


def redis_conn_lost(_d):
    if not RedisServer.available():
        return FaultRow("Redis connection lost mid-load", "skipped: no redis-server", 0, 0)
    c, x = Counter(), payload(7, 1 << 20)
    with RedisServer() as srv:
        reads = [0]
        action = {"what": None}

        def hook(op, name):
            if op == "read" and action["what"]:
                reads[0] += 1
                if reads[0] == 2:           # header read done, payload read next
                    action["what"]()

        tier = DiskTier(capacity_bytes=1 << 26, backend=HookedBackend(srv.backend(), hook))
        c.call(tier.spill, key_for(7), x, META)
        c.call(tier.spill, key_for(8), payload(8), META)
        admin = srv.backend().client
        # 1) the server drops our connection mid-load (CLIENT KILL of every normal client)
        action["what"] = lambda: admin.client_kill_filter(_type="normal", skipme=True)
        r1 = c.load(tier, key_for(7), x)
        c.intact_lost += c.call(tier.state, key_for(7)) not in ("on_disk", "verified")
        # 2) the server dies mid-load
        reads[0], action["what"] = 0, srv.kill
        r2 = c.load(tier, key_for(8), payload(8))
        action["what"] = None
        s = c.call(tier.spill, key_for(9), payload(9), META)
        p = c.call(tier.probe, key_for(9))
    # after CLIENT KILL redis-py may reconnect at checkout and finish the load: verified
    # (and checked against the original) is as correct as a miss here
    ok = (r1 is not None and r1.status in (LoadStatus.MISS, LoadStatus.VERIFIED)
          and r2 is not None
          and r2.status is LoadStatus.MISS and s is not None and not s.ok
          and p is not None and p.state == "absent")
    return c.row("Redis connection lost mid-load",
                 f"connection killed: {r1 and r1.reason} (redis-py reconnects); "
                 f"server killed: {r2 and r2.reason}; "
                 f"spill with server down refused ({s and s.reason})", ok)


def _reap(p):
    """1 (a hang) if the child is still running after its deadline; it is killed."""
    if not p.is_alive():
        return 0
    p.kill()
    p.join(10)
    return 1


def _other_version_child(d, q):
    fmt.FORMAT_VERSION += 1        # this process writes and reads the next format version
    c = Counter()
    t = c.call(DiskTier, d, 1 << 24)
    out = {"indexed": [], "skipped": 0, "adopted": -1, "theirs": None, "overwrote": None,
           "own": None}
    if t is not None:
        out.update(indexed=t.keys(), skipped=t.stats["scan_other_version"],
                   adopted=c.call(t.refresh))
        r = c.load(t, key_for(10), payload(10))
        out["theirs"] = r and r.status.value
        s = c.call(t.spill, key_for(10), payload(10), META)
        out["overwrote"] = bool(s and s.ok)
        c.call(t.spill, key_for(20), payload(20), META)
        r = c.load(t, key_for(20), payload(20))
        out["own"] = bool(r and r.ok)
        c.call(t.close)
    out.update(counts=(c.wrong, c.crashes, c.unnamed, c.hangs, c.trials))
    q.put(out)


def version_skew(d):
    """A process of format version N+1 opens the directory of a version-N process, loads,
    spills and refreshes; then the version-N process refreshes and restarts: neither may
    delete, overwrite or use the other's blobs."""
    c, ctx = Counter(), mp.get_context("spawn")
    tier = DiskTier(d, 1 << 24)
    for i in (10, 11):
        c.call(tier.spill, key_for(i), payload(i), META)
    q = ctx.Queue()
    p = ctx.Process(target=_other_version_child, args=(d, q))
    p.start()
    try:
        got = q.get(timeout=120)
    except queue.Empty:
        got = {"counts": (0, 0, 0, 1, 0)}
    p.join(30)
    c.hangs += _reap(p)
    wrong, crashes, unnamed, hangs, trials = got["counts"]
    c.wrong, c.crashes, c.unnamed, c.hangs = (c.wrong + wrong, c.crashes + crashes,
                                              c.unnamed + unnamed, c.hangs + hangs)
    c.crashes += p.exitcode != 0
    adopted = c.call(tier.refresh)
    ours = [c.load(tier, key_for(i), payload(i)) for i in (10, 11)]
    fresh = c.call(DiskTier, d, 1 << 24)
    names = sorted(os.listdir(d))
    c.intact_lost += sum(not (r and r.ok) for r in ours) + (not got.get("own"))
    c.intact_lost += sum(key_for(i) + ".hkv" not in names for i in (10, 11, 20))
    ok = (got.get("indexed") == [] and got.get("skipped") == 2 and got.get("adopted") == 0
          and got.get("theirs") == "miss" and got.get("overwrote") is False
          and adopted == 0 and fresh is not None and sorted(fresh.keys()) ==
          [key_for(10), key_for(11)] and fresh.stats["scan_other_version"] == 1)
    return c.row("format-version skew, two processes",
                 f"version {fmt.FORMAT_VERSION + 1} process skipped {got.get('skipped')} "
                 f"version-{fmt.FORMAT_VERSION} blobs, their load {got.get('theirs')}, "
                 f"overwrite refused: {got.get('overwrote') is False}; back here refresh "
                 f"adopted {adopted}, restart skipped "
                 f"{fresh.stats['scan_other_version'] if fresh else '-'}; files: {len(names)}",
                 ok, trials=trials + c.trials + 2)


PROC = [crash_before_rename, two_process_race, redis_conn_lost, version_skew]


def run_all(base=None):
    """Every row of the matrix: the file faults, the process and Redis faults, then the
    tier-level rows."""
    rows = []
    for fn in LOCAL[:6] + [crash_before_rename] + LOCAL[6:] + PROC[1:3] + TIER + \
            [redis_full, version_skew]:
        with tempfile.TemporaryDirectory(dir=base) as d:
            rows.append(fn(d))
    return rows
