"""Fault-matrix rows about the tier as a whole: transient read errors, FIFOs / symlinks /
devices named like blobs, a hung backend, a full Redis.  Every call goes through
kit.Counter, so a hang is counted against a deadline and never hangs the command."""
import errno
import os
import stat
import threading

import torch

from hybridkv.disk.backend import HookedBackend
from hybridkv.disk.entry import DiskAdmissionRefused
from hybridkv.disk.format import file_name
from hybridkv.disk.loader import LoadStatus
from hybridkv.disk.local import LocalBackend
from hybridkv.disk.redis_backend import RedisServer
from hybridkv.disk.tier import DiskTier
from hybridkv.testing.faults.hooks import gate
from hybridkv.testing.faults.kit import META, Counter, FaultRow, key_for, payload

GOAL_S = 0.05     # queries under a hung backend


class OneShot:
    """A hook that fails the next ``op`` with ``err`` once armed."""

    def __init__(self):
        self.op, self.err = None, None

    def arm(self, op, err):
        self.op, self.err = op, err

    def __call__(self, op, name):
        if op == self.op:
            err, self.op = self.err, None
            raise OSError(err, f"injected {errno.errorcode[err]}", name)


def transient_reads(d):
    """EIO / timeout / reset / ENOMEM / EAGAIN on open or read: a miss that keeps the entry,
    and the next load verifies."""
    c, hook, keys = Counter(), OneShot(), (1, 2, 3)
    tier = DiskTier(d, 1 << 24, backend=HookedBackend(LocalBackend(d), hook))
    for i in keys:
        c.call(tier.spill, key_for(i), payload(i), META)
    misses = reloads = 0
    for err in (errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ENOMEM, errno.EAGAIN):
        for op in ("open", "read"):
            for i in keys:
                hook.arm(op, err)
                r = c.load(tier, key_for(i), payload(i))
                misses += bool(r and r.status is LoadStatus.MISS and r.reason.startswith("io"))
                c.intact_lost += tier.state(key_for(i)) not in ("on_disk", "verified")
                r = c.load(tier, key_for(i), payload(i))
                reloads += bool(r and r.ok)
    n = 5 * 2 * len(keys)
    return c.row("transient read errors", f"{misses}/{n} injected errors were misses, "
                 f"{reloads}/{n} reloads verified, entries kept", misses == reloads == n,
                 trials=n)


def _unblock(path):
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))   # frees a reader stuck on it
    except OSError:
        pass


def special_files(d):
    """A FIFO, a symlink to a valid blob elsewhere, a symlink to /dev/zero, a directory and
    (when mknod is allowed) a character device, all named like blobs."""
    c, tdir, other = Counter(deadline=5.0), os.path.join(d, "tier"), os.path.join(d, "other")
    c.call(DiskTier(tdir, 1 << 24).spill, key_for(1), payload(1), META)
    c.call(DiskTier(other, 1 << 24).spill, key_for(3), payload(3), META)
    path = {i: os.path.join(tdir, file_name(key_for(i))) for i in range(2, 7)}
    target = os.path.join(other, file_name(key_for(3)))
    os.mkfifo(path[2])
    os.symlink(target, path[3])
    os.symlink("/dev/zero", path[4])
    os.mkdir(path[5])
    try:
        os.mknod(path[6], stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except OSError:
        del path[6]
    before = {p: os.lstat(p)[:2] for p in path.values()}
    misses = refused = 0
    try:
        tier = c.call(DiskTier, tdir, 1 << 24)
        counted = tier.stats["not_regular"] if tier is not None else -1
        if tier is not None:
            c.call(tier.refresh)
            for i in path:
                c.trials += 1
                c.call(tier.probe, key_for(i))
                r = c.load(tier, key_for(i), payload(i))
                misses += bool(r and r.status is LoadStatus.MISS
                               and c.call(tier.state, key_for(i)) == "absent")
                s = c.call(tier.spill, key_for(i), payload(i), META)
                refused += bool(s is not None and not s.ok)
            r = c.load(tier, key_for(1), payload(1))
            c.intact_lost += not (r and r.ok)
    finally:
        _unblock(path[2])
    untouched = before == {p: os.lstat(p)[:2] for p in path.values()}
    c.intact_lost += not os.path.isfile(target)
    ok = misses == refused == counted == len(path) and untouched
    return c.row("FIFO / symlink / device named like a blob",
                 f"{len(path)} special files: open skipped and counted {counted}, "
                 f"{misses} prompt misses, {refused} spills refused (never replaced), "
                 f"untouched: {untouched}", ok, trials=len(path))


def over_budget(fn, *a):
    """fn(*a), or "refused" when it raises the named DiskAdmissionRefused."""
    try:
        return fn(*a)
    except DiskAdmissionRefused:
        return "refused"


def hung_backend(d, rounds=20):
    """Every backend operation hangs: probe, state, keys, spill_async and load_async of other
    keys must still return at once (goal < 50 ms), a full in-flight budget refuses instead
    of blocking, and everything finishes correctly once the backend recovers."""
    c, ev = Counter(deadline=5.0), threading.Event()
    ev.set()
    ops = ("open", "read", "put", "size", "remove", "names")
    tier = DiskTier(d, 1 << 26, backend=HookedBackend(LocalBackend(d), gate(ops, ev, 30.0)),
                    max_in_flight=rounds + 4, workers=2)
    for i in (1, 2, 3):
        c.call(tier.spill, key_for(i), payload(i), META)
    ev.clear()
    loads, spills = [], []
    for j in range(rounds):
        dest = torch.zeros(256, 64)
        loads.append((c.timed(tier.load_async, key_for(1 + j % 3), dest, META), dest, 1 + j % 3))
        c.timed(tier.probe, key_for(1 + (j + 1) % 3))
        c.timed(tier.probe, key_for(900 + j))
        c.timed(tier.state, key_for(1 + (j + 2) % 3))
        c.timed(tier.keys)
        spills.append(c.timed(tier.spill_async, key_for(100 + j), payload(100 + j), META))
    extra = [c.timed(over_budget, tier.spill_async, key_for(500 + j), payload(0), META)
             for j in range(3)]                   # past the in-flight budget
    n_calls = 6 * rounds + len(extra)
    ev.set()
    failed = 0
    for h, dest, i in loads:
        r = h.result(30) if h is not None else None
        failed += r is None or r.status is LoadStatus.MISS
        if r is not None and r.ok:
            c.wrong += not torch.equal(dest, payload(i))
    for h in spills + [h for h in extra if h != "refused"]:
        r = h.result(30) if h is not None else None
        failed += r is None or not r.ok
    c.intact_lost += sum(c.call(tier.state, key_for(i)) not in ("on_disk", "verified")
                         for i in (1, 2, 3))
    c.call(tier.close)
    fast = c.max_seconds is not None and c.max_seconds < GOAL_S
    ok = fast and "refused" in extra and failed == 0
    each = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(c.slowest.items()))
    return c.row("hung backend (every op blocked)",
                 f"{n_calls} queries and async starts while hung, slowest "
                 f"{(c.max_seconds or 0) * 1e3:.2f} ms (goal < {GOAL_S * 1e3:.0f} ms; "
                 f"ms per call: {each}); full "
                 f"budget refused {extra.count('refused')}x, never blocked; {failed} failed "
                 "after recovery", ok, trials=n_calls)


def redis_full(_d, rounds=3):
    """Redis at maxmemory with noeviction: writes are refused, stored entries still load."""
    if not RedisServer.available():
        return FaultRow("Redis full (maxmemory, noeviction)", "skipped: no redis-server", 0, 0)
    c = Counter()
    with RedisServer() as srv:
        tier = DiskTier(capacity_bytes=1 << 30, backend=srv.backend())
        admin = srv.backend().client
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] + (2 << 20))
        stored, refused = [], None
        for i in range(400):
            s = c.call(tier.spill, key_for(i), payload(i), META)
            if s is None or not s.ok:
                refused = s
                break
            stored.append(i)
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] - (64 << 10))
        verified = 0
        for _ in range(rounds):
            for i in stored:
                r = c.load(tier, key_for(i), payload(i))
                verified += bool(r and r.ok)
        c.intact_lost += sum(c.call(tier.state, key_for(i)) not in ("on_disk", "verified")
                             for i in stored)
        again = c.call(tier.spill, key_for(999), payload(999), META)
        c.call(tier.close)
    n = rounds * len(stored)
    ok = refused is not None and len(stored) >= 3 and verified == n and again and not again.ok
    return c.row("Redis full (maxmemory, noeviction)",
                 f"{len(stored)} objects stored before writes were refused "
                 f"({refused and refused.reason}); {verified}/{n} loads verified while full",
                 ok, trials=n)


TIER = [transient_reads, special_files, hung_backend]
