"""Load-or-recompute: compare the time to read a spilled object back with the time to
recompute the tokens it holds.  The disk's bandwidth is measured once at start-up."""
import enum
import os
import secrets
import time
from typing import NamedTuple


class Choice(str, enum.Enum):
    LOAD = "load"            # on disk, verified on arrival: read it
    RECOMPUTE = "recompute"  # cheaper (or only) way to get the state back
    WAIT = "wait"            # a load is already in flight and finishes before a recompute


class CostDecision(NamedTuple):
    choice: Choice
    load_s: float
    recompute_s: float


class Bandwidth(NamedTuple):
    bytes_per_s: float
    nbytes: int
    seconds: float
    cache_dropped: bool   # False: the page cache may have served the read (optimistic)


def measure_read_bandwidth(directory, nbytes=8 << 20, chunk=1 << 20):
    """Sequential read bandwidth of the file system under ``directory``: write ``nbytes``,
    fsync, ask the kernel to drop those pages (posix_fadvise DONTNEED), read them back."""
    path = os.path.join(directory, f".tmp-{os.getpid()}-bw-{secrets.token_hex(4)}")
    block = os.urandom(chunk)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for _ in range(max(1, nbytes // chunk)):
            os.write(fd, block)
        os.fsync(fd)
        dropped = drop_cache(fd)
        buf = bytearray(chunk)
        mv, off, t0 = memoryview(buf), 0, time.perf_counter()
        while True:
            n = os.preadv(fd, [mv], off)
            if n == 0:
                break
            off += n
        dt = max(time.perf_counter() - t0, 1e-9)
    finally:
        os.close(fd)
        os.unlink(path)
    return Bandwidth(off / dt, off, dt, dropped)


def drop_cache(fd):
    """Best effort: evict a file's clean pages so the next read goes to the device."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False


class FlopsModel(NamedTuple):
    """Forward FLOPs of recomputing ``n`` tokens that follow ``start`` cached ones:
    2 * params per token for the matmuls, plus 4 * attn_dim * visible context per layer
    (QK^T and PV).  ``window`` caps the context (sliding-window layers); 0 means none."""
    n_params: int
    n_layers: int
    attn_dim: int
    window: int = 0

    def flops(self, start, n):
        if n <= 0:
            return 0.0
        if self.window:
            ctx = sum(min(self.window, start + i + 1) for i in range(n)) if n < 4096 else \
                n * min(self.window, start + n)
        else:
            ctx = n * start + n * (n + 1) / 2
        return 2.0 * self.n_params * n + 4.0 * self.n_layers * self.attn_dim * ctx


class CostModel:
    """``decide`` returns the cheaper of load and recompute for one object."""

    def __init__(self, read_bytes_per_s, flops_per_s, flops_model, io_latency_s=2e-4):
        if read_bytes_per_s <= 0 or flops_per_s <= 0:
            raise ValueError(f"bandwidth and throughput must be > 0: "
                             f"{read_bytes_per_s!r}, {flops_per_s!r}")
        self.read_bps, self.flops_per_s = float(read_bytes_per_s), float(flops_per_s)
        self.flops_model, self.io_latency_s = flops_model, io_latency_s

    @classmethod
    def measured(cls, directory, flops_per_s, flops_model, nbytes=8 << 20):
        bw = measure_read_bandwidth(directory, nbytes)
        return cls(bw.bytes_per_s, flops_per_s, flops_model)

    def load_seconds(self, nbytes):
        return self.io_latency_s + nbytes / self.read_bps

    def recompute_seconds(self, start, n_tokens):
        return self.flops_model.flops(start, n_tokens) / self.flops_per_s

    def decide(self, nbytes, start, n_tokens, in_flight_left_bytes=None):
        """``in_flight_left_bytes``: bytes a running load still has to read (None: none runs)."""
        rec = self.recompute_seconds(start, n_tokens)
        if in_flight_left_bytes is not None:
            wait = in_flight_left_bytes / self.read_bps
            return CostDecision(Choice.WAIT if wait <= rec else Choice.RECOMPUTE, wait, rec)
        load = self.load_seconds(nbytes)
        return CostDecision(Choice.LOAD if load < rec else Choice.RECOMPUTE, load, rec)
