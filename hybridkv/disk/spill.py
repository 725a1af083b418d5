"""Spills: the caller's bytes are copied into a private staging buffer at once, then the
tier's worker threads write them (temp, fsync, rename, fsync dir) while the caller goes on.

``Writer`` owns the write path of a DiskTier; ``SpillHandle`` is one spill in flight."""
import errno
import threading
import time

import torch

from hybridkv.disk.backend import NotRegular
from hybridkv.disk.blobs import inspect_blob
from hybridkv.disk.entry import WRITING, SpillResult
from hybridkv.disk.format import (check_meta, check_tensor, check_timeout, checksum,
                                  decode_header, dtype_name, encode_header, file_name)


class SpillHandle:
    """One spill.  ``result(timeout)`` is its SpillResult once the blob is published or
    refused, or None when not done within ``timeout`` (None or finite seconds >= 0)."""

    def __init__(self, key):
        self.key = key
        self._done = threading.Event()
        self._result = None

    @classmethod
    def finished(cls, result):
        h = cls(result.key)
        h._finish(result)
        return h

    def done(self):
        return self._done.is_set()

    def result(self, timeout=None):
        check_timeout(timeout)
        return self._result if self._done.wait(timeout) else None

    def _finish(self, result):
        self._result = result
        self._done.set()


def private_bytes(tensor, donated=False):
    """The tensor's bytes in a CPU uint8 tensor the caller will not touch again, copied at
    most once: a donated CPU tensor (the caller's own fresh copy, handed over) is kept as
    it is; a device tensor's .cpu() and a non-contiguous tensor's .contiguous() already
    are private, synchronous copies."""
    private = donated or not tensor.is_contiguous()
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type != "cpu":
        return flat.cpu()
    return flat if private else torch.empty_like(flat).copy_(flat)


class Writer:
    """Starts spills under the index lock, writes them on the tier's worker pool."""

    def __init__(self, backend, index, pool, stats, deleter):
        self.backend, self.index, self.pool = backend, index, pool
        self.stats, self.deleter = stats, deleter

    def start(self, key, tensor, meta, donate=False):
        """See DiskTier.spill_async."""
        file_name(key)
        check_meta(meta)
        dtype_name(check_tensor(tensor))
        shape = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
        size = len(encode_header(key, meta, shape, "0" * 32)) + \
            shape.numel() * shape.element_size()                  # BadInput here
        ix = self.index
        with ix.lock:
            e = ix.get(key)
            if e is not None or key in ix.removing:
                busy = e is None or e.st == WRITING
                return SpillHandle.finished(SpillResult(key, not busy,
                                                        "busy" if busy else "exists"))
            ix.admit()
            e, evicted = ix.reserve(key, size)
            if e is None:
                return SpillHandle.finished(SpillResult(key, False, "no room", size))
        self.stats["evicted"] += len(evicted)
        h = SpillHandle(key)
        try:
            staging = private_bytes(tensor, donate)
        except BaseException:      # no memory for the copy: undo the reservation, re-raise
            self.deleter.remove(evicted)
            self._finish(e, h, SpillResult(key, False, "no memory", size))
            raise
        try:
            self.pool.submit(self._run, e, h, staging, shape, meta, evicted,
                             time.perf_counter())
        except RuntimeError:       # the tier was closed
            self.deleter.remove(evicted)
            self._finish(e, h, SpillResult(key, False, "tier closed", size))
        return h

    def _run(self, e, h, staging, shape, meta, evicted, t0):
        try:
            res, hdr, nbytes = self._write(e, staging, shape, meta, evicted, t0)
        except Exception as err:   # noqa: BLE001 -- a bug must not kill the worker or the spill
            self.stats["internal_errors"] += 1
            res, hdr, nbytes = SpillResult(e.key, False, f"internal: {err!r}"), None, 0
        self._finish(e, h, res, hdr, nbytes)

    def _write(self, e, staging, shape, meta, evicted, t0):
        """(SpillResult, header of the blob now published or None, its size)."""
        self.deleter.remove(evicted)
        name = file_name(e.key)
        if self.backend.shared:    # published meanwhile by another process?
            found = inspect_blob(self.backend, name)
            if found.verdict == "ok":
                return (SpillResult(e.key, True, "exists", found.entry.nbytes,
                                    time.perf_counter() - t0),
                        found.entry.hdr, found.entry.nbytes)
            if found.verdict in ("not_regular", "other_version"):   # not ours: never replaced
                return SpillResult(e.key, False, found.verdict.replace("_", " ")), None, 0
        payload = memoryview(staging.numpy())
        head = encode_header(e.key, meta, shape, checksum(payload))
        try:
            self.backend.put(name, [head, payload])
        except NotRegular:
            return SpillResult(e.key, False, "not a regular blob"), None, 0
        except OSError as err:
            why = f"io: {errno.errorcode.get(err.errno, type(err).__name__)}"
            return SpillResult(e.key, False, why, e.nbytes), None, 0
        return (SpillResult(e.key, True, "written", e.nbytes, time.perf_counter() - t0),
                decode_header(head), e.nbytes)

    def _finish(self, e, h, res, hdr=None, nbytes=0):
        with self.index.lock:
            if res.ok:
                self.index.published(e, hdr, nbytes)
            else:
                self.index.abort(e)
        self.stats["spilled" if res.reason == "written" else
                   "spill_exists" if res.ok else "spill_failed"] += 1
        h._finish(res)
