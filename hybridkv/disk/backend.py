"""Storage-backend protocol: a flat namespace of immutable, atomically published blobs.

Contract for every backend:
- ``put(name, parts)`` publishes the concatenation of ``parts`` under ``name`` atomically:
  a reader sees either the previous complete blob, the new complete blob, or nothing --
  never a prefix.  Any failure raises OSError and leaves no published partial blob.
- ``open_read(name)`` returns a reader (``read_into(offset, buf) -> bytes read``, short at
  the end of the blob; ``close()``).  A missing blob raises FileNotFoundError, a name
  that is not a plain blob (FIFO, device, symlink, directory, a Redis key of another type)
  NotRegular -- without blocking, following or touching it -- other failures OSError.
  Local readers read one file version even if it is replaced meanwhile.
- ``size``/``names``/``remove``/``sweep_temp`` raise only OSError.  ``remove`` of a missing
  name is not an error; ``remove`` of a name that is not a plain blob raises NotRegular.
  ``sweep_temp`` deletes leftovers of crashed writers (regular files only), returns a count.
- Optional ``list_blobs() -> (names, skipped)``: ``names()`` plus how many entries were
  left out because they are not plain blobs (FIFO, device, symlink, directory).
Backends know nothing of headers or checksums; the tier verifies everything it reads.
"""
import errno
from typing import Protocol, runtime_checkable


class NotRegular(OSError):
    """A blob name that holds something else (FIFO, device, symlink, directory ...): never
    opened for reading in a blocking way, never followed, never deleted."""

    def __init__(self, name, what):
        super().__init__(errno.EINVAL, f"not a regular blob ({what})", name)
        self.what = what


@runtime_checkable
class StorageBackend(Protocol):
    shared: bool    # True when other processes may publish into the same namespace

    def put(self, name: str, parts: list) -> None: ...
    def open_read(self, name: str): ...
    def size(self, name: str) -> int: ...
    def names(self) -> list: ...
    def remove(self, name: str) -> None: ...
    def sweep_temp(self) -> int: ...


def list_blobs(backend):
    """(names, skipped) from ``backend.list_blobs()``, or (names(), 0) without it."""
    fn = getattr(backend, "list_blobs", None)
    return fn() if fn is not None else (backend.names(), 0)


def read_exact(reader, offset, n):
    """``n`` bytes at ``offset`` as a bytearray, or a short one when the blob ends early."""
    buf = bytearray(n)
    got = reader.read_into(offset, memoryview(buf))
    return buf if got == n else buf[:got]


def read_head(backend, name, n):
    reader = backend.open_read(name)
    try:
        return read_exact(reader, 0, n)
    finally:
        reader.close()


class HookedBackend:
    """A seam: wraps any backend and calls ``hook(op, name)`` before each operation; the
    hook may raise (OSError to inject EIO/ENOSPC) or sleep (to hold a load in flight).  The
    fault matrix and the tests pass hooks from hybridkv.testing.faults.hooks instead of
    patching globals."""

    def __init__(self, inner, hook):
        self.inner, self.hook = inner, hook
        self.shared = inner.shared

    def put(self, name, parts):
        self.hook("put", name)
        return self.inner.put(name, parts)

    def open_read(self, name):
        self.hook("open", name)
        return _HookedReader(self.inner.open_read(name), self.hook, name)

    def size(self, name):
        self.hook("size", name)
        return self.inner.size(name)

    def names(self):
        self.hook("names", "")
        return self.inner.names()

    def list_blobs(self):
        self.hook("names", "")
        return list_blobs(self.inner)

    def remove(self, name):
        self.hook("remove", name)
        return self.inner.remove(name)

    def sweep_temp(self):
        return self.inner.sweep_temp()

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


class _HookedReader:
    def __init__(self, inner, hook, name):
        self.inner, self.hook, self.name = inner, hook, name

    def read_into(self, offset, buf):
        self.hook("read", self.name)
        return self.inner.read_into(offset, buf)

    def close(self):
        self.inner.close()
