"""DiskTier: spilled copies of cache objects, verified on every load.

Entry states are spec.disk.DiskPrefixMachine's (free, writing, on_disk, loading, verified,
corrupt); TierIndex fires every transition through the spec's compiled table, so the guards
(can_load_ok, ...) are the spec's own functions.

Contract:
- The tier lock is never held across backend I/O.  ``probe``, ``state``, ``keys``,
  ``in_flight``, ``used_bytes``, ``cap`` never touch the backend; ``spill_async`` and
  ``load_async`` only reserve under the lock and hand the I/O to the worker threads, so
  all of them return at once even while the backend hangs.
- Blobs other processes publish are adopted only by ``refresh()`` (blocking; the cache
  manager calls it off its own lock); ``load_async`` of a key not in the index is a MISS
  "absent".
- ``spill_async`` copies the tensor's bytes before it returns (or keeps a donated copy),
  then publishes atomically (temp, fsync, rename, fsync dir); I/O errors come back as
  SpillResult(ok=False), never as exceptions.  ``spill`` waits for that.  ``epoch`` grows
  whenever a failed spill might now succeed, so a caller retries a failure once per change.
- A load's result is VERIFIED only after the header and payload checksum verified and the
  bytes were copied into the caller's tensor in place; anything else is a MISS, CANCELLED
  or BUSY -- never an exception, never unverified bytes in the destination.  A transient
  error (I/O, timeout, lost connection, out of memory) keeps the entry on_disk; only a copy
  verified damaged in our own format is dropped and deleted.
- Bad arguments raise a named BadInput and change nothing; a full in-flight budget raises
  DiskAdmissionRefused and changes nothing (never blocks).
- A new DiskTier rebuilds its index from headers alone (as ``refresh``) and sweeps temp
  files of dead writers.  Capacity evicts least recently used idle entries (never one that
  is loading or being written).
"""
import collections
from concurrent.futures import ThreadPoolExecutor

from hybridkv.disk.backend import list_blobs
from hybridkv.disk.blobs import Deleter, inspect_blob
from hybridkv.disk.entry import (LOADING, ON_DISK, STATE_NAMES, VERIFIED, WRITING,
                                 DiskAdmissionRefused, DiskProbe, IllegalTransition,
                                 SpillResult, rec)
from hybridkv.disk.format import (BadInput, check_meta, check_timeout, file_name, key_of,
                                  validate_key)
from hybridkv.disk.index import TierIndex
from hybridkv.disk.loader import (Fetched, LoadHandle, LoadResult, LoadStatus, Outcome,
                                  fetch_verified)
from hybridkv.disk.local import LocalBackend
from hybridkv.disk.spill import SpillHandle, Writer

__all__ = ["DiskTier", "DiskAdmissionRefused", "DiskProbe", "IllegalTransition",
           "SpillHandle", "SpillResult", "STATE_NAMES"]


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
        self.backend, self.cost_model = backend, cost_model
        self.stats = collections.Counter()
        self._index = TierIndex(capacity_bytes, max_in_flight)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hkv-disk")
        self._deleter = Deleter(backend, self._index, self.stats)
        self._writer = Writer(backend, self._index, self._pool, self.stats, self._deleter)
        try:
            self.stats["temp_swept"] += backend.sweep_temp()
        except OSError:
            self.stats["sweep_errors"] += 1
        self._scan("indexed")

    # ---- queries: never backend I/O ---------------------------------------------------
    @property
    def capacity(self):
        """Bytes the indexed blobs may take (a smaller value applies from the next spill)."""
        return self._index.capacity

    @capacity.setter
    def capacity(self, nbytes):
        if type(nbytes) is not int or nbytes <= 0:
            raise BadInput("capacity_bytes must be a positive int", nbytes)
        with self._index.lock:
            self._index.capacity = nbytes
            self._index.epoch += 1

    @property
    def epoch(self):
        """A count that grows whenever a spill that failed might now succeed: an entry was
        dropped (bytes freed), a spill was published (the backend takes writes) or the
        capacity changed.  A caller that saw a spill fail at epoch E need not retry it while
        the epoch is still E (a full disk or a full Redis fails every retry alike)."""
        return self._index.epoch

    @property
    def cap(self):
        """Objects in flight (writing + loading) at most."""
        return self._index.cap

    @property
    def used_bytes(self):
        return self._index.used

    @property
    def in_flight(self):
        return self._index.in_flight

    def keys(self):
        with self._index.lock:
            return list(self._index.entries)

    def state(self, key):
        """The entry's spec state id, or "absent"."""
        validate_key(key)
        with self._index.lock:
            e = self._index.get(key)
            return STATE_NAMES[e.st] if e else "absent"

    def probe(self, key, start=0, n_tokens=0):
        """State of ``key`` and, with a cost model, the load / wait / recompute choice."""
        validate_key(key)
        with self._index.lock:
            e = self._index.get(key)
            if e is None:
                return DiskProbe(key, "absent", 0, None)
            st, nbytes, h = e.st, e.nbytes, e.handle
        dec = None
        if self.cost_model is not None and st in (ON_DISK, VERIFIED, LOADING):
            left = max(0, nbytes - h.progress) if st == LOADING and h else None
            dec = self.cost_model.decide(nbytes, start, n_tokens, left)
        return DiskProbe(key, STATE_NAMES[st], nbytes, dec)

    # ---- adoption ----------------------------------------------------------------------
    def refresh(self):
        """Adopt blobs other processes published since the index was built or last
        refreshed; returns how many.  Blocking: lists the backend and reads the new headers
        without the tier lock, then adopts them under it, oldest first (capacity evicts as
        for a spill).  A header damaged in our format is deleted."""
        return self._scan("adopted")

    def _scan(self, counter):
        try:
            names, self.stats["not_regular"] = list_blobs(self.backend)
        except OSError:
            self.stats["list_errors"] += 1
            return 0
        named = {key_of(n): n for n in names if key_of(n) is not None}
        with self._index.lock:
            new = [(k, n) for k, n in named.items()
                   if self._index.get(k) is None and k not in self._index.removing]
        found = []
        for key, name in new:
            got = inspect_blob(self.backend, name)
            if got.verdict == "ok":
                found.append(got.entry)
            elif got.verdict == "corrupt":
                self._deleter.remove_corrupt(key, got.head, claimed=False)
            else:
                self.stats[f"scan_{got.verdict}"] += 1
        with self._index.lock:
            n = sum(self._index.adopt(e) for e in sorted(found, key=lambda e: e.hdr.t_ns))
            evicted = self._index.make_room(0) or []
        self.stats["evicted"] += len(evicted)
        self._deleter.remove(evicted)
        self.stats[counter] += n
        return n

    # ---- spills ------------------------------------------------------------------------
    def spill_async(self, key, tensor, meta, donate=False):
        """Start writing ``tensor`` (any dtype in format.DTYPES, any shape) as object
        ``key``; returns a SpillHandle.  The bytes are copied before this returns, so the
        caller may reuse the tensor at once -- unless ``donate``: the caller hands over a
        fresh copy it never touches again, which is written as it is (no second copy).  A
        key already indexed, being written or being deleted finishes at once ("exists" /
        "busy"), as does one that cannot fit ("no room").  Raises BadInput or
        DiskAdmissionRefused, changing nothing."""
        return self._writer.start(key, tensor, meta, donate)

    def spill(self, key, tensor, meta):
        """spill_async, then wait for its SpillResult."""
        return self.spill_async(key, tensor, meta).result()

    # ---- loads -------------------------------------------------------------------------
    def load_async(self, key, dest, meta, still_valid=None):
        """Start loading ``key`` into ``dest`` (a preallocated contiguous tensor of the
        stored dtype and shape).  ``still_valid()`` is called right before the copy; False
        means the destination was recycled and the load is cancelled untouched."""
        validate_key(key)
        check_meta(meta)
        if not hasattr(dest, "is_contiguous") or not dest.is_contiguous():
            raise BadInput("destination must be a contiguous tensor", type(dest).__name__)
        ix = self._index
        with ix.lock:
            e = ix.get(key)
            if e is None:
                self.stats["miss_absent"] += 1
                return LoadHandle.finished(LoadResult(key, LoadStatus.MISS, "absent"))
            if e.st not in (ON_DISK, VERIFIED):
                return LoadHandle.finished(LoadResult(key, LoadStatus.BUSY,
                                                      STATE_NAMES[e.st]))
            ix.admit()
            h = LoadHandle(key, dest, still_valid)
            ix.go(e, "load_start")
            e.handle = h
        try:
            self._pool.submit(self._run_load, e, h, meta)
        except RuntimeError:            # the tier was closed
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
            try:
                why = h._deliver(f.staging)       # calls the caller's still_valid()
            except Exception as x:  # noqa: BLE001 -- must not strand the entry in loading
                h.cancel()
                why = f"internal: {type(x).__name__}: {x}"
            if why is not None:
                f = f._replace(outcome=Outcome.CANCELLED, reason=why, staging=None)
        self._finish_load(e, h, meta, f)

    def _finish_load(self, e, h, meta, f):
        """One load's end.  Only a copy verified damaged in our own format is dropped and
        deleted; a transient error, a cancel or a mismatch leave the entry on_disk (spec
        load_cancel); a blob that is gone is forgotten, its name left alone."""
        ix, o = self._index, f.outcome
        with ix.lock:
            e.handle = None
            if o is Outcome.VERIFIED:
                ix.go(e, "load_ok", rec(1, 1, f.hdr.abi, f.hdr.payload_off, e.st), meta.abi)
                ix.touch(e.key)
            elif o is Outcome.CORRUPT:
                ix.go(e, "load_bad", rec(0, 0, meta.abi, 1, e.st), meta.abi)
                ix.drop(e, delete=True)
            else:
                ix.go(e, "load_cancel")
                if o is Outcome.GONE:
                    ix.drop(e, delete=False)
        if o is Outcome.CORRUPT:
            self._deleter.remove_corrupt(e.key, f.head, claimed=True)
        internal = f.reason.startswith("internal")
        self.stats["internal_errors" if internal else f"load_{o.name.lower()}"] += 1
        status = {Outcome.VERIFIED: LoadStatus.VERIFIED,
                  Outcome.CANCELLED: LoadStatus.CANCELLED}.get(o, LoadStatus.MISS)
        nbytes = f.staging.numel() if o is Outcome.VERIFIED else 0
        h._finish(LoadResult(e.key, status, f.reason, nbytes, f.seconds))

    # ---- removal, shutdown -------------------------------------------------------------
    def discard(self, key):
        """Drop ``key`` and delete its blob (blocking); True if it was indexed.  A load in
        flight is cancelled instead (False); an entry being written is left alone."""
        validate_key(key)
        with self._index.lock:
            e = self._index.get(key)
            if e is None or e.st == WRITING:
                return False
            if e.st == LOADING:
                e.handle.cancel()
                return False
            self._index.drop(e, delete=True)
        self._deleter.remove([key])
        return True

    def close(self):
        """Wait for the writes and loads in flight, then close the backend."""
        self._pool.shutdown(wait=True, cancel_futures=False)
        close = getattr(self.backend, "close", None)
        if close:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
