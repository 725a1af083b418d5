"""Asynchronous, verified loads: read header, read payload, checksum, and only then copy
into the caller's preallocated tensor.  Every failure becomes a LoadResult, never an
exception on the caller's side and never a byte of unverified data in the destination."""
import enum
import errno
import threading
import time
from typing import NamedTuple

import torch

from hybridkv.disk.backend import NotRegular, read_exact
from hybridkv.disk.format import HEADER_MAX, CorruptObject, OtherVersion, check_timeout, \
    checksum, decode_header
from spec.disk import DiskRec, DiskPrefixMachine, can_load_ok


class LoadStatus(str, enum.Enum):
    VERIFIED = "verified"    # destination holds the checksummed payload
    MISS = "miss"            # not loadable (absent, I/O error, corrupt, mismatch): recompute
    CANCELLED = "cancelled"  # caller cancelled / destination recycled; destination untouched
    BUSY = "busy"            # another load of this key is in flight: wait for it or recompute


class LoadResult(NamedTuple):
    key: str
    status: LoadStatus
    reason: str
    nbytes: int = 0
    seconds: float = 0.0

    @property
    def ok(self):
        return self.status is LoadStatus.VERIFIED


class DiskCtx(NamedTuple):
    kabi: int


def disk_rec(**fields):
    """A spec.disk.DiskRec with the given fields and every other field 0 (the runtime
    tracks only what the disk guards read: st, hdr, ck, abi, off)."""
    return DiskRec(**{f: int(fields.get(f, 0)) for f in DiskRec._fields})


def load_verdict(hdr_ok, abi, off, ck_ok, expected_abi):
    """Adapter onto spec.disk.can_load_ok: the one rule for "this load may complete"."""
    rec = disk_rec(st=DiskPrefixMachine.loading.value, hdr=hdr_ok, ck=ck_ok, abi=abi, off=off)
    return bool(can_load_ok(rec, DiskCtx(expected_abi)))


class LoadHandle:
    """One load in flight.  ``cancel()`` returns True when the destination is guaranteed
    never to be written by this load (cancelled before the copy); False when the copy
    already happened (the result is VERIFIED)."""

    def __init__(self, key, dest, still_valid=None):
        self.key, self.dest, self.still_valid = key, dest, still_valid
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancelled = False
        self._result = None
        self.progress = 0   # payload bytes read so far (cost model: how long to wait)

    @classmethod
    def finished(cls, result):
        h = cls(result.key, None)
        h._finish(result)
        return h

    def cancel(self):
        with self._lock:
            if self._done.is_set():
                return self._result.status is not LoadStatus.VERIFIED
            self._cancelled = True
            return True

    @property
    def cancelled(self):
        return self._cancelled

    def done(self):
        return self._done.is_set()

    def result(self, timeout=None):
        """The LoadResult, or None when it is not ready within ``timeout`` seconds (None or
        a finite number >= 0; anything else raises BadInput)."""
        check_timeout(timeout)
        return self._result if self._done.wait(timeout) else None

    def _finish(self, result):
        self._result = result
        self._done.set()

    def _deliver(self, staging):
        """Copy verified bytes into the destination unless cancelled/recycled.  The lock
        makes cancel() and the copy mutually exclusive."""
        with self._lock:
            if self._cancelled:
                return "cancelled"
            if self.still_valid is not None and not self.still_valid():
                self._cancelled = True
                return "destination recycled"
            ptr = self.dest.data_ptr()
            if staging.numel():
                self.dest.view(-1).view(torch.uint8).copy_(staging)
            assert self.dest.data_ptr() == ptr   # loads never move the destination
            return None


_tls = threading.local()


def _staging(n):
    """This worker thread's reusable staging buffer (torch-allocated: aligned, already
    faulted in after first use; copy_ from it is a plain memcpy).  Each worker runs one
    load at a time and copies out before the next, so one buffer per thread suffices."""
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _tls.buf = torch.empty(max(n, 1 << 20), dtype=torch.uint8)
    return buf[:n]


class NotOurs(CorruptObject):
    """Intact object that is not the one asked for (other ABI, kind, shape, range)."""


class Outcome(enum.Enum):
    """What one read of a blob found, and so what the tier does with its entry."""
    VERIFIED = "verified"    # header and checksum verified (the copy out is still to come)
    CANCELLED = "cancelled"  # cancelled before the copy: entry stays on_disk
    TRANSIENT = "io"         # I/O error, timeout, lost connection, out of memory: stays
    MISMATCH = "mismatch"    # intact, ours, but not what was asked for: stays
    GONE = "gone"            # no blob of ours under that name any more: forget, keep the file
    CORRUPT = "corrupt"      # damaged in our own format: forget and delete


class Fetched(NamedTuple):
    outcome: Outcome
    reason: str
    staging: object = None   # verified payload bytes (VERIFIED only)
    hdr: object = None       # decoded header, when it decoded
    head: bytes = None       # the raw header bytes read (what a deletion re-checks)
    seconds: float = 0.0


def fetch_verified(backend, name, key, expect, dest, handle):
    """Read and verify one object through one reader; never raises.  ``expect`` is a
    DiskMeta; ``dest`` gives dtype and shape; ``handle`` is polled for cancellation."""
    t0, head, hdr = time.perf_counter(), None, None

    def out(outcome, reason, staging=None):
        return Fetched(outcome, reason, staging, hdr, head, time.perf_counter() - t0)
    try:
        reader = backend.open_read(name)
        try:
            head = bytes(read_exact(reader, 0, HEADER_MAX))
            hdr = decode_header(head)             # raises CorruptObject on any damage
            staging = _fetch(reader, hdr, key, expect, dest, handle)
        finally:
            reader.close()
    except FileNotFoundError:
        return out(Outcome.GONE, "missing")
    except NotRegular as x:
        return out(Outcome.GONE, f"not a regular blob: {x.what}")
    except OtherVersion as x:
        return out(Outcome.GONE, f"other format version: {x.version}")
    except NotOurs as x:
        return out(Outcome.MISMATCH, f"mismatch: {x.reason}")
    except CorruptObject as x:
        return out(Outcome.CORRUPT, f"corrupt: {x.reason}")
    except OSError as x:
        return out(Outcome.TRANSIENT, f"io: {errno.errorcode.get(x.errno, type(x).__name__)}")
    except Exception as x:   # noqa: BLE001 -- a bug must not kill the loader or cost the entry
        return out(Outcome.TRANSIENT, f"internal: {type(x).__name__}: {x}")
    if staging is None:
        return out(Outcome.CANCELLED, "cancelled")
    return out(Outcome.VERIFIED, "verified", staging)


def _fetch(reader, hdr, key, expect, dest, handle):
    """The verified payload in this thread's staging buffer, or None when cancelled."""
    if hdr.key != key:
        raise CorruptObject("header names another key", hdr.key)
    want = (expect.kind, str(dest.dtype).removeprefix("torch."), tuple(dest.shape),
            expect.tok_lo, expect.tok_hi)
    got = (hdr.kind, hdr.dtype, hdr.shape, hdr.tok_lo, hdr.tok_hi)
    if want != got:
        raise NotOurs("header does not describe the requested object", (got, want))
    if not load_verdict(True, hdr.abi, hdr.payload_off, True, expect.abi):
        raise NotOurs("ABI id or payload alignment rejected", (hdr.abi, hdr.payload_off))
    if handle.cancelled:
        return None
    staging = _staging(hdr.payload_len)
    mv, got_n, step = memoryview(staging.numpy()), 0, 4 << 20
    while got_n < hdr.payload_len:
        n = reader.read_into(hdr.payload_off + got_n, mv[got_n:got_n + step])
        if n == 0:
            break
        got_n += n
        handle.progress = got_n
        if handle.cancelled:
            return None
    if got_n != hdr.payload_len:
        raise CorruptObject("truncated payload", (got_n, hdr.payload_len))
    ck_ok = checksum(mv) == hdr.payload_ck
    if not load_verdict(True, hdr.abi, hdr.payload_off, ck_ok, expect.abi):
        raise CorruptObject("payload checksum mismatch", hdr.payload_ck)
    return staging
