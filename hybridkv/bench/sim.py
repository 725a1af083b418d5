"""The replay loop: one trace through one manager, and the three-way comparison.

Seam for the runtime: `replay(trace, manager_factory, layout, capacity_blocks)` builds
`manager_factory(layout, capacity_blocks)` and calls `serve(trace, req) -> Served` once per
request in arrival order (lookup + allocate + free: 3 ops). A CacheManager adapter only needs that
method. Token hit rate = reused prompt tokens / prompt tokens; recomputed = the rest; FLOPs saved
uses the layout's FLOP model over [0, H). Latency is wall time of one `serve`.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

from hybridkv.bench.baselines import belady, check_capacity, flatten
from hybridkv.bench.layouts import LayoutCost
from hybridkv.bench.managers import LRUManager, PolicyManager
from hybridkv.bench.traces import Trace

OPS_PER_REQUEST = 3


class ReplayResult(NamedTuple):
    hit_rate: float               # tokens
    block_hit_rate: float
    hit_tokens: int
    total_tokens: int
    recomputed_tokens: int
    flops_saved: float
    flops_total: float
    group_hit_tokens: dict
    ops: int
    seconds: float
    ops_per_s: float
    latency_us: dict              # p50, p90, p99, max

    def as_dict(self) -> dict:
        return self._asdict()


def _pct(sorted_vals: list, q: float) -> float:
    if not sorted_vals:
        return 0.0
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def replay(trace: Trace, manager_factory: Callable, layout: LayoutCost, capacity_blocks: int,
           progress: bool = False) -> ReplayResult:
    check_capacity(capacity_blocks)
    mgr = manager_factory(layout, capacity_blocks)
    reqs = trace.requests
    it = reqs
    if progress:
        from tqdm import tqdm
        it = tqdm(reqs, desc=f"replay {type(mgr).__name__}", unit="req", leave=False)
    lat = []
    hit_tok = hit_blk = tot_blk = tot_tok = 0
    fl_saved = fl_total = 0.0
    groups: dict = {}
    clock = time.perf_counter
    t_all = 0.0
    for req in it:
        t0 = clock()
        s = mgr.serve(trace, req)
        dt = clock() - t0
        t_all += dt
        lat.append(dt)
        hit_tok += s.hit_tokens
        hit_blk += s.hit_blocks
        tot_blk += len(req.hash_ids)
        tot_tok += req.input_length
        fl_saved += layout.prefix_flops(s.hit_tokens)
        fl_total += layout.prefix_flops(req.input_length)
        for g, v in s.groups.items():
            groups[g] = groups.get(g, 0) + v
    lat.sort()
    ops = OPS_PER_REQUEST * len(reqs)
    return ReplayResult(
        hit_tok / tot_tok if tot_tok else 0.0, hit_blk / tot_blk if tot_blk else 0.0,
        hit_tok, tot_tok, tot_tok - hit_tok, fl_saved, fl_total, groups, ops, t_all,
        ops / t_all if t_all > 0 else 0.0,
        {q: _pct(lat, v) * 1e6 for q, v in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.))})


class BeladySummary(NamedTuple):
    hit_rate: float               # tokens, from the block-optimal schedule (not itself optimal)
    block_hit_rate: float         # the upper bound
    seconds: float


def belady_summary(trace: Trace, capacity_blocks: int) -> BeladySummary:
    t0 = time.perf_counter()
    acc = flatten(trace.keys(r) for r in trace.requests)
    w = [trace.block_tokens(r, i) for r in trace.requests for i in range(len(r.hash_ids))]
    b = belady(acc, capacity_blocks, w)
    return BeladySummary(b.hit_weight / b.total_weight if b.total_weight else 0.0,
                         b.hits / b.accesses if b.accesses else 0.0, time.perf_counter() - t0)


def compare(trace: Trace, layout: LayoutCost, capacity_blocks: int, progress: bool = False,
            ours_factory: Callable = PolicyManager) -> dict:
    """ours / LRU / Belady at one capacity -> the `--json` object of `hybridkv replay`."""
    ours = replay(trace, ours_factory, layout, capacity_blocks, progress)
    lru = replay(trace, LRUManager, layout, capacity_blocks, progress)
    bel = belady_summary(trace, capacity_blocks)
    ratio = ours.block_hit_rate / bel.block_hit_rate if bel.block_hit_rate else 1.0
    return {
        "trace": trace.name, "layout": layout.name, "capacity_blocks": capacity_blocks,
        "requests": len(trace),
        "ours": ours.as_dict(), "lru": lru.as_dict(), "belady": bel._asdict(),
        "ours_over_belady": ratio,
        "ours_over_belady_tokens": ours.hit_rate / bel.hit_rate if bel.hit_rate else 1.0,
        "ops_ratio_ours_over_lru": ours.ops_per_s / lru.ops_per_s if lru.ops_per_s else 0.0,
    }
