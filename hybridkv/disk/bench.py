"""Spill and load throughput of a DiskTier against the raw sequential read bandwidth of
the same file system, measured in the same run.

Caveat: the page cache.  Files are fsynced and then dropped with posix_fadvise(DONTNEED)
before every timed read, so reads should reach the device; a VM's host cache (or a
tmpfs) can still serve them, and then both numbers measure memory, not the disk.  The
ratio compares like with like either way.
"""
import os
import time
from typing import NamedTuple

import torch

from hybridkv.disk.costmodel import drop_cache, measure_read_bandwidth
from hybridkv.disk.format import DiskMeta, file_name
from hybridkv.disk.tier import DiskTier


class BenchResult(NamedTuple):
    n_objects: int
    object_bytes: int
    spill_bytes_per_s: float    # checksum + header + write + fsync + rename + dir fsync
    load_bytes_per_s: float     # async loads: read + verify + copy into preallocated tensors
    seq_read_bytes_per_s: float
    load_bandwidth_ratio: float # load / the faster of two sequential-read probes
    cache_dropped: bool


def _drop_files(directory):
    ok = True
    for f in os.listdir(directory):
        fd = os.open(os.path.join(directory, f), os.O_RDONLY)
        try:
            ok = drop_cache(fd) and ok
        finally:
            os.close(fd)
    return ok


def benchmark(directory, n_objects=8, object_bytes=4 << 20, workers=4):
    """Spill ``n_objects`` float32 tensors of ``object_bytes``, then load them all back
    concurrently; compare with a plain sequential read of as many bytes."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(object_bytes // 4, generator=g) for _ in range(n_objects)]
    keys = [f"{0xbe00 + i:032x}" for i in range(n_objects)]
    meta = DiskMeta("compressed_kv", abi=1, tok_lo=0, tok_hi=0)
    total = n_objects * object_bytes
    with DiskTier(directory, capacity_bytes=4 * total + (1 << 20),
                  max_in_flight=n_objects, workers=workers) as tier:
        t0 = time.perf_counter()
        for k, x in zip(keys, xs):
            if not tier.spill(k, x, meta).ok:
                raise RuntimeError(f"benchmark spill failed for {k}")
        spill = total / (time.perf_counter() - t0)
        seq = measure_read_bandwidth(directory, total)
        dropped = _drop_files(directory) and seq.cache_dropped
        dests = [torch.zeros_like(x) for x in xs]   # pool blocks: allocated and touched
        t0 = time.perf_counter()
        handles = [tier.load_async(k, dst, meta) for k, dst in zip(keys, dests)]
        results = [h.result(120) for h in handles]
        load = total / (time.perf_counter() - t0)
        # a second probe after the loads; the faster one is the baseline (conservative ratio)
        seq = max(seq, measure_read_bandwidth(directory, total), key=lambda b: b.bytes_per_s)
        bad = [r for r in results if r is None or not r.ok]
        if bad or not all(torch.equal(a, b) for a, b in zip(xs, dests)):
            raise RuntimeError(f"benchmark loads failed: {bad[:2]}")
        for k in keys:
            tier.backend.remove(file_name(k))
    return BenchResult(n_objects, object_bytes, spill, load, seq.bytes_per_s,
                       load / seq.bytes_per_s, dropped)
