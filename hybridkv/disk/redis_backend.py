"""Redis backend: blobs as Redis strings, so several engine processes share spilled objects.

A blob is published with one SET (atomic in Redis: readers see the old value, the new one
or nothing).  Reads are plain GETRANGEs, never MULTI/EXEC: a server at maxmemory with
noeviction refuses to queue any command of a transaction but still serves reads, so a full
Redis keeps serving hits.  Only a read that comes back short asks EXISTS, so "missing" and
"short" differ.  Every redis-py error becomes an OSError (out of memory: ENOSPC, timeout:
ETIMEDOUT, lost connection: ECONNRESET, else EIO): to the tier it is a transient I/O error,
i.e. a miss that keeps the entry.  Headers and checksums are the tier's business, exactly as
on disk.
"""
import errno
import shutil
import socket
import subprocess
import tempfile
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from hybridkv.disk.backend import NotRegular

CHUNK = 4 << 20


_ERRNO = ((redis.exceptions.OutOfMemoryError, errno.ENOSPC),
          (redis.TimeoutError, errno.ETIMEDOUT),      # before ConnectionError: not a subclass
          (redis.ConnectionError, errno.ECONNRESET))


def _oserror(e, name):
    if isinstance(e, OSError):
        return e
    if isinstance(e, redis.ResponseError) and str(e).startswith("WRONGTYPE"):
        return NotRegular(name, "redis key of another type")
    code = next((c for cls, c in _ERRNO if isinstance(e, cls)), errno.EIO)
    return OSError(code, f"redis: {type(e).__name__}: {e}", name)


class _RedisReader:
    """Chunked GETRANGE reads.  A value replaced mid-read can mix two versions; the
    tier's checksum turns that into a miss (keys are content hashes, so it is rare)."""

    def __init__(self, backend, name):
        self.b, self.name = backend, name

    def read_into(self, offset, buf):
        b, name, k = self.b, self.name, self.b._k(self.name)
        mv, got = memoryview(buf).cast("B"), 0
        while got < len(mv):
            n, start = min(CHUNK, len(mv) - got), offset + got
            data = b._call(name, lambda: b.client.getrange(k, start, start + n - 1))
            if len(data) < n and not b._call(name, lambda: b.client.exists(k)):
                raise FileNotFoundError(errno.ENOENT, "no such blob", name)
            mv[got:got + len(data)] = data
            got += len(data)
            if len(data) < n:
                break
        return got

    def close(self):
        pass


class RedisBackend:
    shared = True

    def __init__(self, host="127.0.0.1", port=6379, prefix="hkv:", client=None, timeout=5.0):
        if any(c in prefix for c in "*?[]\\"):
            raise ValueError(f"redis key prefix must not contain glob characters: {prefix!r}")
        self.prefix = prefix
        self.client = client or redis.Redis(
            host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0))

    def _k(self, name):
        return (self.prefix + name).encode()

    def _call(self, name, fn):
        try:
            return fn()
        except redis.RedisError as e:
            raise _oserror(e, name) from None

    def put(self, name, parts):
        data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        self._call(name, lambda: self.client.set(self._k(name), data))

    def open_read(self, name):
        return _RedisReader(self, name)

    def size(self, name):
        if not self._call(name, lambda: self.client.exists(self._k(name))):
            raise FileNotFoundError(errno.ENOENT, "no such blob", name)
        return int(self._call(name, lambda: self.client.strlen(self._k(name))))

    def names(self):
        keys = self._call("", lambda: list(self.client.scan_iter(match=self.prefix + "*",
                                                                    count=1000)))
        n = len(self.prefix)
        return [k.decode(errors="replace")[n:] for k in keys]

    def remove(self, name):
        self._call(name, lambda: self.client.delete(self._k(name)))

    def sweep_temp(self):
        return 0    # SET publishes atomically; there are no temp keys

    def close(self):
        try:
            self.client.close()
        except redis.RedisError:
            pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free loopback port, no persistence.  ``with`` starts it
    (raises FileNotFoundError without the binary, RuntimeError if it never answers)."""

    def __init__(self, binary=None):
        self.binary = binary or shutil.which("redis-server")
        self.port, self.proc, self.dir = None, None, None

    @staticmethod
    def available():
        return shutil.which("redis-server") is not None

    def start(self, timeout=10.0):
        if not self.binary:
            raise FileNotFoundError(errno.ENOENT, "redis-server not installed", "redis-server")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hkv-redis-")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if c.ping():
                    c.close()
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self):
        """Hard stop (SIGKILL): connections drop mid-command, like a crashed server."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def backend(self, prefix="hkv:"):
        return RedisBackend(port=self.port, prefix=prefix)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
