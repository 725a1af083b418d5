"""Baselines over block accesses: vLLM-style single-queue LRU, and Belady's MIN (offline optimum).

Access model shared by every simulator: requests are served one at a time in arrival order. A
request looks up its block keys, the leading run of cached keys is the hit, the rest is computed
and allocated, then the request frees all its blocks, which stay cached (evictable).

`LRUPrefixCache` (vLLM v1 style): one free queue, ordered for eviction. Blocks in use by the
running request are out of the queue; freed blocks are appended tail-block first, so a request's
deepest blocks are evicted before its shared head. A hit touches nothing until the request runs.

`belady(...)` is MIN with bypass on the flat sequence of block accesses at the same capacity: on
a miss, keep the block only if its next use is sooner than the farthest next use in the cache.
It counts every access found in cache (not only leading runs) and ignores that a request's
blocks must be resident together, so it is an upper bound on any policy's block hits.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Iterable, NamedTuple, Sequence


class CapacityError(ValueError):
    """Capacity must be a non-negative int. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"capacity must be an int >= 0: {value!r}")
        self.value = value


def check_capacity(c) -> int:
    if isinstance(c, bool) or not isinstance(c, int) or c < 0:
        raise CapacityError(c)
    return c


class LRUPrefixCache:
    """Block-level prefix cache with one LRU free queue (vLLM-style).

    Contract: `serve(keys)` returns the number of leading keys that were cached before the call;
    afterwards every key of the request that fit is cached, and len(self) <= capacity always.
    """

    def __init__(self, capacity: int):
        self.capacity = check_capacity(capacity)
        self._free: OrderedDict = OrderedDict()   # cached and evictable, LRU first

    def __len__(self) -> int:
        return len(self._free)

    def __contains__(self, key) -> bool:
        return key in self._free

    def lookup(self, keys: Sequence) -> int:
        n = 0
        free = self._free
        for k in keys:
            if k not in free:
                break
            n += 1
        return n

    def serve(self, keys: Sequence) -> int:
        hit = self.lookup(keys)
        free = self._free
        used = []
        seen = set()
        for k in keys:                      # take the request's blocks out of the free queue
            if k in seen:
                continue
            seen.add(k)
            if k in free:
                del free[k]
                used.append(k)
            elif len(free) + len(used) < self.capacity:
                used.append(k)
            elif free:
                free.popitem(last=False)
                used.append(k)
            # else: no room even after evicting everything; the block is computed, not cached
        for k in reversed(used):            # free tail first: evicted before the shared head
            free[k] = None
        return hit


class BeladyResult(NamedTuple):
    hits: int
    accesses: int
    hit_weight: float          # sum of weights of hit accesses (e.g. tokens)
    total_weight: float


def belady(accesses: Sequence, capacity: int,
           weights: Sequence[float] | None = None) -> BeladyResult:
    """MIN with bypass over `accesses` (hashable keys) at `capacity`. O(n log n): a next-use
    index built backwards, and a max-heap of (next use, key) with lazy deletion."""
    capacity = check_capacity(capacity)
    n = len(accesses)
    nxt = [0] * n
    last: dict = {}
    inf = n + 1
    for i in range(n - 1, -1, -1):
        k = accesses[i]
        nxt[i] = last.get(k, inf)
        last[k] = i
    cached: dict = {}              # key -> its next use
    heap: list = []                # (-next_use, seq, key); stale when cached.get(key) differs
    hits = 0
    hw = 0.0
    seq = itertools.count()        # tie-breaker: keys themselves may not be comparable
    for i in range(n):
        k = accesses[i]
        nu = nxt[i]
        if k in cached:
            hits += 1
            if weights is not None:
                hw += weights[i]
        elif capacity == 0 or nu == inf:
            continue               # bypass: never used again
        elif len(cached) >= capacity:
            while True:            # farthest valid entry
                far, _, fk = heap[0]
                if cached.get(fk) == -far:
                    break
                heapq.heappop(heap)
            if -far <= nu:
                continue           # bypass: the newcomer is needed later than everything cached
            heapq.heappop(heap)
            del cached[fk]
        cached[k] = nu
        heapq.heappush(heap, (-nu, next(seq), k))
        if len(heap) > 4 * capacity + 64:   # compact stale entries
            heap = [(-v, next(seq), key) for key, v in cached.items()]
            heapq.heapify(heap)
    total = float(sum(weights)) if weights is not None else float(n)
    return BeladyResult(hits, n, hw if weights is not None else float(hits), total)


def flatten(requests: Iterable[Sequence]) -> list:
    """Concatenate per-request key sequences into one access sequence."""
    out: list = []
    for keys in requests:
        out.extend(keys)
    return out


def engine_rule_bound(trace) -> float:
    """Token hit rate of an unbounded cache under the engine rule (``trace.reusable_blocks``):
    the most any engine can reuse on ``trace``."""
    cache = LRUPrefixCache(max(1, sum(len(r.hash_ids) for r in trace.requests)))
    hit = total = 0
    for req in trace.requests:
        k = min(cache.serve(trace.keys(req)), trace.reusable_blocks(req))
        hit += sum(trace.block_tokens(req, i) for i in range(k))
        total += req.input_length
    return hit / total if total else 0.0
