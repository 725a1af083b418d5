"""DiskTier: spilled copies of cache objects, verified on every load.

Entry states are spec.disk.DiskPrefixMachine's (free, writing, on_disk, loading, verified,
corrupt) and every transition goes through the spec's compiled table (spec.table.fire),
so the guards (can_spill_done, can_load_ok) are the spec's own functions.

Contract:
- ``spill`` publishes atomically (temp, fsync, rename, fsync dir) and returns a
  SpillResult; I/O errors (EIO, ENOSPC, ...) come back as ok=False, never as exceptions.
- ``load_async`` returns a LoadHandle; its result is VERIFIED only after the header and
  payload checksum verified and the bytes were copied into the caller's tensor in place.
  Anything else is a MISS (entry invalidated), CANCELLED or BUSY -- never an exception,
  never wrong data in the destination.
- Bad arguments raise a named BadInput and change nothing; a full in-flight budget
  raises DiskAdmissionRefused and changes nothing.
- A new DiskTier on the same backend rebuilds its index from headers alone and sweeps
  temp files of dead writers.  Capacity is enforced by evicting least recently used idle
  entries (never one that is loading or being written).
"""
import collections
import errno
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hybridkv.disk.entry import (CORRUPT, FREE, LOADING, ON_DISK, STATE_NAMES, VERIFIED,
                                 WRITING, DiskAdmissionRefused, DiskProbe, Entry,
                                 IllegalTransition, SpillResult, read_entry)
from hybridkv.disk.entry import rec as make_rec
from hybridkv.disk.format import (BadInput, CorruptObject, check_meta, check_tensor,
                                  check_timeout, checksum, decode_header, dtype_name, encode_header, file_name,
                                  tensor_bytes, validate_key)
from hybridkv.disk.loader import (DiskCtx, Fetched, LoadHandle, LoadResult, LoadStatus,
                                  Outcome, fetch_verified)
from hybridkv.disk.local import LocalBackend
from spec.disk import DiskPrefixMachine as M
from spec.table import fire

__all__ = ["DiskTier", "DiskAdmissionRefused", "DiskProbe", "IllegalTransition",
           "SpillResult", "STATE_NAMES"]


class DiskTier:
    def __init__(self, path=None, capacity_bytes=1 << 30, backend=None, max_in_flight=8,
                 workers=4, cost_model=None):
        if backend is None:
            if path is None:
                raise BadInput("need a path or a backend", path)
            backend = LocalBackend(path)
        if type(capacity_bytes) is not int or capacity_bytes <= 0:
            raise BadInput("capacity_bytes must be a positive int", capacity_bytes)
        if type(max_in_flight) is not int or max_in_flight <= 0:
            raise BadInput("max_in_flight must be a positive int", max_in_flight)
        self.backend, self.capacity, self.cap = backend, capacity_bytes, max_in_flight
        self.cost_model = cost_model
        self._lock = threading.RLock()
        self._idx = collections.OrderedDict()   # key -> _Entry, least recently used first
        self._used = 0
        self._in_flight = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hkv-disk")
        self.stats = collections.Counter()
        self._rebuild()

    # ---- state machine ------------------------------------------------------------------
    def _go(self, e, event, rec=None, kabi=0):
        ok, tgt = fire(M, event, e.st, rec or make_rec(st=e.st), DiskCtx(kabi))
        if not ok:
            raise IllegalTransition(event, e.st)
        if e.st in (WRITING, LOADING):
            self._in_flight -= 1
        if tgt in (WRITING, LOADING):
            self._in_flight += 1
        e.st = tgt

    def _drop(self, e, delete_file):
        """Invalidate an idle entry (on_disk / verified / corrupt -> free)."""
        self._go(e, "drop")
        self._idx.pop(e.key, None)
        self._used -= e.nbytes
        if delete_file:
            try:
                self.backend.remove(file_name(e.key))
            except OSError:
                self.stats["remove_errors"] += 1

    # ---- index ----------------------------------------------------------------------------
    def _read_entry(self, name):
        return read_entry(self.backend, name, self.stats)

    def _rebuild(self):
        try:
            self.stats["temp_swept"] += self.backend.sweep_temp()
            names = self.backend.names()
        except OSError:
            names = []
        found = [e for e in map(self._read_entry, names) if e is not None]
        with self._lock:
            for e in sorted(found, key=lambda e: e.hdr.t_ns):
                self._idx[e.key] = e
                self._used += e.nbytes
            self._make_room(0)

    def _lookup(self, key):
        """Index entry for ``key``; adopts a blob another process published (shared tier)."""
        e = self._idx.get(key)
        if e is None and self.backend.shared:
            e = self._read_entry(file_name(key))
            if e is not None:
                self._idx[key] = e
                self._used += e.nbytes
                self.stats["adopted"] += 1
        return e

    def _make_room(self, need):
        """Evict LRU idle entries until ``need`` more bytes fit; False if they cannot."""
        idle = [e for e in self._idx.values() if e.st in (ON_DISK, VERIFIED, CORRUPT)]
        if self._used + need - sum(e.nbytes for e in idle) > self.capacity:
            return False
        for e in idle:
            if self._used + need <= self.capacity:
                break
            self._drop(e, delete_file=True)
            self.stats["evicted"] += 1
        return True

    # ---- public API -------------------------------------------------------------------
    @property
    def used_bytes(self):
        return self._used

    @property
    def in_flight(self):
        return self._in_flight

    def keys(self):
        with self._lock:
            return list(self._idx)

    def state(self, key):
        with self._lock:
            e = self._idx.get(validate_key(key))
            return STATE_NAMES[e.st] if e else "absent"

    def spill(self, key, tensor, meta):
        """Write ``tensor`` (any dtype in format.DTYPES, any shape) as object ``key``."""
        name = file_name(key)
        check_meta(meta)
        dtype_name(check_tensor(tensor))
        t0 = time.perf_counter()
        payload = tensor_bytes(tensor)
        with self._lock:
            e = self._lookup(key)
            if e is not None:
                return SpillResult(key, e.st != WRITING, "exists" if e.st != WRITING else "busy")
            if self._in_flight >= self.cap:
                raise DiskAdmissionRefused(self._in_flight, self.cap)
            head = encode_header(key, meta, tensor, "0" * 32)   # size only; BadInput here
            size = len(head) + len(payload)
            if size > self.capacity or not self._make_room(size):
                return SpillResult(key, False, "no room", size)
            e = Entry(key, FREE, size)
            self._go(e, "spill_start")
            self._idx[key] = e
            self._used += size
        try:
            ck = checksum(payload)
            head = encode_header(key, meta, tensor, ck)
            self.backend.put(name, [head, payload])
        except OSError as err:
            with self._lock:
                self._go(e, "spill_crash")
                self._idx.pop(key, None)
                self._used -= size
                self.stats["spill_failed"] += 1
            return SpillResult(key, False, f"io: {errno.errorcode.get(err.errno, err)}", size)
        with self._lock:
            self._go(e, "spill_done", make_rec(1, 1, meta.abi, len(head), e.st))
            e.hdr = decode_header(head)
            self.stats["spilled"] += 1
        return SpillResult(key, True, "written", size, time.perf_counter() - t0)

    def probe(self, key, start=0, n_tokens=0):
        """State of ``key`` and, with a cost model, the load / wait / recompute choice."""
        with self._lock:
            e = self._lookup(validate_key(key))
            if e is None:
                return DiskProbe(key, "absent", 0, None)
            st, nbytes, h = e.st, e.nbytes, e.handle
        dec = None
        if self.cost_model is not None and st in (ON_DISK, VERIFIED, LOADING):
            left = max(0, nbytes - h.progress) if st == LOADING and h else None
            dec = self.cost_model.decide(nbytes, start, n_tokens, left)
        return DiskProbe(key, STATE_NAMES[st], nbytes, dec)

    def load_async(self, key, dest, meta, still_valid=None):
        """Start loading ``key`` into ``dest`` (a preallocated contiguous tensor of the
        stored dtype and shape).  ``still_valid()`` is called right before the copy; False
        means the destination was recycled and the load is cancelled untouched."""
        validate_key(key)
        check_meta(meta)
        if not hasattr(dest, "is_contiguous") or not dest.is_contiguous():
            raise BadInput("destination must be a contiguous tensor", type(dest).__name__)
        with self._lock:
            e = self._lookup(key)
            if e is None:
                self.stats["miss_absent"] += 1
                return LoadHandle.finished(LoadResult(key, LoadStatus.MISS, "absent"))
            if e.st not in (ON_DISK, VERIFIED):
                return LoadHandle.finished(LoadResult(key, LoadStatus.BUSY,
                                                      STATE_NAMES[e.st]))
            if self._in_flight >= self.cap:
                raise DiskAdmissionRefused(self._in_flight, self.cap)
            h = LoadHandle(key, dest, still_valid)
            self._go(e, "load_start")
            e.handle = h
        try:
            self._pool.submit(self._run_load, e, h, meta)
        except RuntimeError:            # pool shut down
            self._finish_load(e, h, meta, Fetched(Outcome.CANCELLED, "tier closed"))
        return h

    def load(self, key, dest, meta, timeout=None):
        """Synchronous convenience wrapper around load_async; ``timeout`` (None or finite
        seconds >= 0) is checked before the load starts."""
        check_timeout(timeout)
        h = self.load_async(key, dest, meta)
        r = h.result(timeout)
        if r is None:
            h.cancel()
            r = h.result(timeout) or LoadResult(key, LoadStatus.CANCELLED, "timeout")
        return r

    def _run_load(self, e, h, meta):
        f = fetch_verified(self.backend, file_name(e.key), e.key, meta, h.dest, h)
        if f.outcome is Outcome.VERIFIED:
            why = h._deliver(f.staging)
            if why is not None:
                f = f._replace(outcome=Outcome.CANCELLED, reason=why, staging=None)
        self._finish_load(e, h, meta, f)

    def _finish_load(self, e, h, meta, f):
        """One load's end.  Only a copy verified corrupt in our own format is dropped and
        deleted; a transient error, a cancel or a mismatch leave the entry on_disk (spec
        load_cancel); a blob that is gone is forgotten, its name left alone."""
        with self._lock:
            e.handle = None
            o = f.outcome
            if o is Outcome.VERIFIED:
                ok = make_rec(1, 1, f.hdr.abi, f.hdr.payload_off, e.st)
                self._go(e, "load_ok", ok, meta.abi)
                self._idx.move_to_end(e.key)
                self.stats["load_verified"] += 1
                res = LoadResult(e.key, LoadStatus.VERIFIED, "verified", f.staging.numel(),
                                 f.seconds)
            elif o is Outcome.CORRUPT:
                self._go(e, "load_bad", make_rec(0, 0, meta.abi, 1, e.st), meta.abi)
                self._drop(e, delete_file=True)
                self.stats["load_corrupt"] += 1
            else:
                self._go(e, "load_cancel")
                if o is Outcome.GONE:
                    self._drop(e, delete_file=False)
                self.stats["internal_errors" if f.reason.startswith("internal") else
                           f"load_{o.name.lower()}"] += 1
            if o is not Outcome.VERIFIED:
                res = LoadResult(e.key, LoadStatus.CANCELLED if o is Outcome.CANCELLED else
                                 LoadStatus.MISS, f.reason, 0, f.seconds)
        h._finish(res)

    def discard(self, key):
        """Drop ``key`` (cancelling a load in flight first); returns True if it was indexed."""
        with self._lock:
            e = self._idx.get(validate_key(key))
            if e is None or e.st == WRITING:
                return False
            if e.st == LOADING:
                e.handle.cancel()
                return False
            self._drop(e, delete_file=True)
            return True

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=False)
        close = getattr(self.backend, "close", None)
        if close:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
