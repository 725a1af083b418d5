"""The replay loop: one trace through one manager, and ours vs LRU vs Belady at one capacity.

A manager has ``prepare(trace, req)`` (untimed: e.g. expanding hash ids into token ids) and
``serve(trace, req, prepared) -> Served``; requests are served one at a time in arrival order.
Token hit rate = reused prompt tokens / prompt tokens; recomputed = the rest; FLOPs saved uses
the layout's FLOP model over [0, H).  Latency is the wall time of one ``serve``; ops are the
manager's calls (``manager.ops`` when it counts them: lookup, each allocate and commit, free;
else 3 per request).

``compare`` is the ``--json`` object of ``hybridkv replay``: ours = the real
``hk.CacheManager`` (bench.runtime.RuntimeManager), LRU = the vLLM-style baseline over the
trace's blocks (bench.managers.LRUManager) counting hits as an engine can use them (whole blocks,
the last prompt token always computed: the rule ours serves under), ``lru_trace_blocks`` = the
same cache counting every leading cached trace block (the accounting of the earlier simulator
figures, partial last block and whole-prompt repeats included), Belady = MIN over the same block
accesses (trace-block accounting), ``engine_bound`` = an unbounded cache under the engine rule.
"""
from __future__ import annotations

import time
from typing import NamedTuple

from hybridkv.bench.baselines import belady, check_capacity, engine_rule_bound, flatten
from hybridkv.bench.layouts import BLOCK, LayoutCost, get_layout
from hybridkv.bench.managers import LRUManager
from hybridkv.bench.percentile import nearest_rank
from hybridkv.bench.traces import Trace

OPS_PER_REQUEST = 3


class ReplayResult(NamedTuple):
    hit_rate: float               # tokens
    block_hit_rate: float         # hit tokens // trace block / trace blocks
    hit_tokens: int
    total_tokens: int
    recomputed_tokens: int
    flops_saved: float
    flops_total: float
    group_hit_tokens: dict
    requests: int
    ops: int
    seconds: float                # inside serve only
    ops_per_s: float
    requests_per_s: float
    latency_us: dict              # p50, p90, p99, max of one serve

    def as_dict(self) -> dict:
        return self._asdict()


def replay(trace: Trace, manager, cost: LayoutCost, progress: bool = False) -> ReplayResult:
    reqs = trace.requests
    it = reqs
    if progress:
        from tqdm import tqdm
        it = tqdm(reqs, desc=f"replay {type(manager).__name__}", unit="req", leave=False)
    lat = []
    hit_tok = hit_blk = tot_blk = tot_tok = 0
    fl_saved = fl_total = 0.0
    groups: dict = {}
    clock = time.perf_counter
    t_all = 0.0
    for req in it:
        prepared = manager.prepare(trace, req)
        t0 = clock()
        s = manager.serve(trace, req, prepared)
        dt = clock() - t0
        t_all += dt
        lat.append(dt)
        hit_tok += s.hit_tokens
        hit_blk += s.hit_blocks
        tot_blk += len(req.hash_ids)
        tot_tok += req.input_length
        fl_saved += cost.prefix_flops(s.hit_tokens)
        fl_total += cost.prefix_flops(req.input_length)
        for g, v in s.groups.items():
            groups[g] = groups.get(g, 0) + v
    lat.sort()
    ops = getattr(manager, "ops", OPS_PER_REQUEST * len(reqs))
    return ReplayResult(
        hit_tok / tot_tok if tot_tok else 0.0, hit_blk / tot_blk if tot_blk else 0.0,
        hit_tok, tot_tok, tot_tok - hit_tok, fl_saved, fl_total, groups, len(reqs), ops, t_all,
        ops / t_all if t_all > 0 else 0.0, len(reqs) / t_all if t_all > 0 else 0.0,
        {q: (nearest_rank(lat, v) or 0.0) * 1e6
         for q, v in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))})


class BeladySummary(NamedTuple):
    hit_rate: float               # tokens, from the block-optimal schedule (not itself optimal)
    block_hit_rate: float         # the upper bound
    capacity_keys: int            # capacity in trace blocks
    seconds: float


def belady_summary(trace: Trace, capacity_blocks: int) -> BeladySummary:
    """MIN over the trace's block accesses at `capacity_blocks` 512-token blocks (as many trace
    blocks as hold the same tokens)."""
    t0 = time.perf_counter()
    keys = capacity_blocks * BLOCK // trace.block_size
    acc = flatten(trace.keys(r) for r in trace.requests)
    w = [trace.block_tokens(r, i) for r in trace.requests for i in range(len(r.hash_ids))]
    b = belady(acc, keys, w)
    return BeladySummary(b.hit_weight / b.total_weight if b.total_weight else 0.0,
                         b.hits / b.accesses if b.accesses else 0.0, keys,
                         time.perf_counter() - t0)


def compare(trace: Trace, layout: str, capacity_blocks: int, progress: bool = False,
            **runtime_options) -> dict:
    """ours (the runtime) / LRU / Belady at one capacity -> the `--json` object of
    `hybridkv replay`. ``runtime_options`` go to RuntimeManager."""
    from hybridkv.bench.runtime import RuntimeManager
    check_capacity(capacity_blocks)
    cost = get_layout(layout)
    lengths = [r.input_length for r in trace.requests] or [1]
    mgr = RuntimeManager(layout, capacity_blocks, max(lengths), sum(lengths) / len(lengths),
                         block_tokens=trace.block_size, **runtime_options)
    ours = replay(trace, mgr, cost, progress)
    lru = replay(trace, LRUManager(cost, capacity_blocks, trace.block_size, engine_rule=True),
                 cost, progress)
    lru_blocks = replay(trace, LRUManager(cost, capacity_blocks, trace.block_size), cost,
                        progress)
    bel = belady_summary(trace, capacity_blocks)
    return {
        "trace": trace.name, "layout": layout, "capacity_blocks": capacity_blocks,
        "block_tokens": trace.block_size, "requests": len(trace),
        "ours": ours.as_dict(), "lru": lru.as_dict(), "lru_trace_blocks": lru_blocks.as_dict(),
        "belady": bel._asdict(), "engine_bound": engine_rule_bound(trace),
        "ours_over_lru": ours.hit_rate / lru.hit_rate if lru.hit_rate else None,
        "ours_over_belady_tokens": ours.hit_rate / bel.hit_rate if bel.hit_rate else None,
        "runtime": mgr.describe(),
    }
