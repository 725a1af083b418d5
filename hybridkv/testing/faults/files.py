"""The disk tier's fault matrix, file faults: each scenario injects one fault through a
FileOps subclass or a HookedBackend (never by patching globals) and counts, from the
caller's side, what hybridkv.testing.faults.kit lists.  Every count must end at 0."""
import errno
import os
import tempfile
import threading

import torch

from hybridkv.disk.backend import HookedBackend
from hybridkv.disk.format import file_name
from hybridkv.disk.loader import LoadStatus
from hybridkv.disk.local import FileOps, LocalBackend
from hybridkv.disk.tier import DiskTier
from hybridkv.testing.faults.hooks import gate
from hybridkv.testing.faults.kit import META, SENTINEL, Counter, key_for, payload

__all__ = ["LOCAL", "FaultyOps", "run_local"]


class FaultyOps(FileOps):
    """FileOps with switchable injected errors."""

    def __init__(self):
        self.read_err = self.write_err = None
        self.partial_first_write = False

    def pread_into(self, fd, buf, offset):
        if self.read_err:
            raise OSError(self.read_err, os.strerror(self.read_err))
        return super().pread_into(fd, buf, offset)

    def write(self, fd, mv):
        if self.write_err:
            if self.partial_first_write and len(mv) > 1:
                self.partial_first_write = False
                return super().write(fd, mv[: len(mv) // 2])
            raise OSError(self.write_err, os.strerror(self.write_err))
        return super().write(fd, mv)


def _temps(d):
    return [f for f in os.listdir(d) if f.startswith(".tmp-")]


def eio_read(d):
    ops, c, x = FaultyOps(), Counter(), payload(1)
    tier = DiskTier(d, 1 << 24, backend=LocalBackend(d, ops))
    c.call(tier.spill, key_for(1), x, META)
    ops.read_err = errno.EIO
    r = c.load(tier, key_for(1), x)
    kept = tier.state(key_for(1)) == "on_disk"
    c.intact_lost += not kept
    ops.read_err = None
    again = c.load(tier, key_for(1), x)          # the file itself was fine
    ok = r is not None and r.status is LoadStatus.MISS and kept and again and again.ok
    return c.row("EIO on read", f"miss ({r and r.reason}), entry kept on_disk; after the "
                 f"fault the same tier loads it: {again and again.status.value}", ok)


def _write_fault(d, name, err, partial):
    ops, c, x = FaultyOps(), Counter(), payload(2)
    tier = DiskTier(d, 1 << 24, backend=LocalBackend(d, ops))
    ops.write_err, ops.partial_first_write = err, partial
    s = c.call(tier.spill, key_for(2), x, META)
    leftovers = _temps(d) + [f for f in os.listdir(d) if f.endswith(".hkv")]
    r = c.load(tier, key_for(2), x)
    ops.write_err = None
    s2 = c.call(tier.spill, key_for(2), x, META)
    r2 = c.load(tier, key_for(2), x)
    ok = (s is not None and not s.ok and not leftovers and r is not None
          and r.status is LoadStatus.MISS and s2 and s2.ok and r2 and r2.ok)
    return c.row(name, f"spill refused ({s and s.reason}), nothing published, no temp left, "
                 f"load misses; retry after the fault: {r2 and r2.status.value}", ok)


def eio_write(d):
    return _write_fault(d, "EIO on write", errno.EIO, False)


def enospc(d):
    return _write_fault(d, "ENOSPC", errno.ENOSPC, True)


def _damage_rows(d, name, positions_fn, damage):
    """Spill, damage the file at each position, load: every load must miss untouched."""
    c, x, misses, cases, reasons = Counter(), payload(3), 0, 0, set()
    tier = DiskTier(d, 1 << 24)
    path = os.path.join(d, file_name(key_for(3)))
    c.call(tier.spill, key_for(3), x, META)
    positions = c.call(positions_fn, tier, path) or []
    for pos in positions:
        tier.discard(key_for(3))
        if os.path.exists(path):     # a flipped version field is kept by the tier (it may be
            os.unlink(path)          # another version's blob): the harness clears it
        c.call(tier.spill, key_for(3), x, META)
        c.call(damage, path, pos)
        r = c.load(tier, key_for(3), x)
        cases += 1
        misses += bool(r is not None and r.status is LoadStatus.MISS)
        reasons.add(r.reason.split(":")[0] + ":" + r.reason.split(":")[-1] if r else None)
    tier.discard(key_for(3))
    c.call(tier.spill, key_for(3), x, META)
    c.call(damage, path, positions[-1])
    fresh = DiskTier(d, 1 << 24)    # a restart must not index a damaged file either
    misses -= any(not str(r).startswith(("corrupt", "other format version"))
                  for r in reasons)                 # only corruption (or version skew)
    return c, cases, misses, fresh, sorted(map(str, reasons))


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


def bitflip_payload(d):
    def positions(tier, path):
        off = 4096
        return [off, off + 1, off + 7777, off + 65535]
    c, n, m, fresh, why = _damage_rows(d, "", positions, _flip)
    ok = n == 4 and m == n and fresh.state(key_for(3)) == "on_disk"
    return c.row("bit flip in payload", f"{m}/{n} loads missed {why}, files removed "
                 "(restart indexes by header only; the checksum is checked at load)", ok,
                 trials=n)


def bitflip_header(d):
    def positions(tier, path):
        with open(path, "rb") as f:
            end = 16 + int.from_bytes(f.read(16)[12:16], "little") + 16
        return [0, 9, 13, 20, end // 2, end - 20, end - 1]
    c, n, m, fresh, why = _damage_rows(d, "", positions, _flip)
    ok = n == 7 and m == n and fresh.state(key_for(3)) == "absent"
    return c.row("bit flip in header", f"{m}/{n} loads missed {why} (a flipped version "
                 "field reads as another version: kept, never used); restart does not "
                 "index it", ok, trials=n)


def truncated(d):
    def positions(tier, path):
        size = os.path.getsize(path)
        return [0, 10, 100, 4095, 4096, size - 1]

    def cut(path, n):
        os.truncate(path, n)
    c, n, m, fresh, why = _damage_rows(d, "", positions, cut)
    ok = n == 6 and m == n and fresh.state(key_for(3)) == "absent"
    return c.row("truncated file", f"{m}/{n} truncation points missed {why}; restart "
                 "skips it", ok, trials=n)


def dest_recycled(d):
    """The destination block is recycled while its load waits on I/O: by cancel() and by
    the still_valid() re-check; the new owner's bytes must survive."""
    c, x, ev = Counter(), payload(4), threading.Event()
    tier = DiskTier(d, 1 << 24, backend=HookedBackend(LocalBackend(d), gate("read", ev)))
    c.call(tier.spill, key_for(4), x, META)
    outcomes = []
    for how in ("cancel", "still_valid"):
        ev.clear()
        gen = [0]
        dest = torch.full_like(x, SENTINEL)
        h = c.call(tier.load_async, key_for(4), dest, META,
                   still_valid=(lambda g=gen[0]: gen[0] == g))
        if h is None:
            continue
        busy = tier.probe(key_for(4)).state == "loading"
        owner = torch.full_like(x, 777.0)
        if how == "cancel":
            h.cancel()
        gen[0] += 1
        dest.copy_(owner)                      # the new owner writes its own data
        ev.set()
        r = h.result(10)
        c.wrong += not torch.equal(dest, owner)
        outcomes.append(busy and r is not None and r.status is LoadStatus.CANCELLED)
    r = c.load(tier, key_for(4), x)
    ok = len(outcomes) == 2 and all(outcomes) and r is not None and r.ok
    return c.row("destination evicted/recycled while a load is in flight",
                 "cancelled both ways (cancel(), still_valid re-check); new owner's bytes "
                 f"intact; entry back on disk, reload {r and r.status.value}", ok,
                 trials=len(outcomes))


LOCAL = [eio_read, eio_write, enospc, bitflip_payload, bitflip_header, truncated,
         dest_recycled]


def run_local(base=None):
    rows = []
    for fn in LOCAL:
        with tempfile.TemporaryDirectory(dir=base) as d:
            rows.append(fn(d))
    return rows
