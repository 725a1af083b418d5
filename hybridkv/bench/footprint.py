"""Bookkeeping bytes per block: the Python heap a KV cache manager holds beside the KV bytes
themselves, measured the same way for hybridkv's CacheManager (`hybridkv_side --footprint`) and
vLLM's KVCacheManager (`vllm_side.py --footprint`).  Stdlib only: `vllm_side.py` imports nothing
of ours and keeps standalone twins of HeapMeter and summary, held equal by a test
(tests/bench/test_footprint.py).

One untimed pass in a process of its own (tracemalloc slows every allocation, so it never runs
around a timed call): a throwaway manager serves the stream's first two requests (imports and
lazy caches happen there, untraced), then tracing starts and
  built    bytes the manager's construction allocated and still holds: every Python object and
           container it made (block records, free lists, state arrays, dicts, the Python objects
           of its tensors), after gc.collect();
  stream   bytes still held once the whole stream has been served, every request freed and the
           driver dropped, after gc.collect(): built plus what the cached blocks keep (hashes,
           index and hash-map entries) and anything else the manager grew and kept.
Not counted: tensor storage (torch's allocator is outside tracemalloc's view, and hybridkv's
pools are built on the meta device for this pass: no KV storage at all; vLLM's manager holds
none); anything allocated before tracing (imports, the stream's token lists); tracemalloc's own
tables.  Per block: divided by the manager's block count (hybridkv: the blocks of every pool;
vLLM: KVCacheConfig.num_blocks, its null block included)."""
import gc
import tracemalloc


class HeapMeter:
    """``with HeapMeter() as meter: ... meter.held()``: bytes of Python heap allocated since the
    ``with`` began and still live, after gc.collect()."""

    def __init__(self):
        self.base = 0           # traced bytes when the with began

    def __enter__(self):
        gc.collect()
        tracemalloc.start()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def held(self) -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - self.base

    def __exit__(self, *exc):
        tracemalloc.stop()


def summary(num_blocks: int, cached_blocks: int, built: int, stream: int) -> dict:
    """The footprint of one manager: bytes held after construction and after the stream, per
    block, and what the stream added per block it left cached."""
    return {"num_blocks": num_blocks, "cached_blocks": cached_blocks,
            "built_bytes": built, "stream_bytes": stream,
            "built_per_block": round(built / num_blocks, 1),
            "stream_per_block": round(stream / num_blocks, 1),
            "added_per_cached_block": round((stream - built) / cached_blocks, 1)
            if cached_blocks else None}
