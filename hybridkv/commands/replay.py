"""`hybridkv replay TRACE|synthetic`: replay a serving trace through ours, LRU and Belady."""
from __future__ import annotations

import json
import os
import sys

NAME = "replay"
HELP = ("replay a Mooncake-format trace (or 'synthetic') at a capacity: token hit rate, FLOPs "
        "saved, ops/s and latency for ours vs vLLM-style LRU vs Belady")
PLOT_CAPACITIES = (1000, 10000, 100000)
RUNTIME_LIMIT = 300


def vllm_status() -> dict:
    """The optional vLLM baseline. hybridkv does not drive vLLM's KVCacheManager (vllm needs
    CUDA; this project runs CPU-only), so the result is always {"skipped": reason}, with the
    reason saying whether vllm is importable at all."""
    try:
        import vllm  # noqa: F401
    except Exception as e:                     # any import failure means: not usable here
        return {"skipped": f"vllm is not installed ({type(e).__name__}: {e}); install the "
                           "optional vllm extra on a CUDA machine to compare"}
    return {"skipped": "vllm is installed but its KVCacheManager baseline is not wired in "
                       "hybridkv replay"}


def add_arguments(p) -> None:
    p.add_argument("trace", help="Mooncake JSONL file (plain or .gz), or 'synthetic'")
    p.add_argument("--layout", default="full", choices=("full", "v4-mini"))
    p.add_argument("--capacity-blocks", type=int, default=10000,
                   help="cache size in 512-token blocks of the layout's bytes per block")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--synthetic-requests", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also sweep capacities 1k/10k/100k (+C) and plot hit rate vs capacity")
    p.add_argument("--manager", default="sim", choices=("sim", "runtime"),
                   help="'runtime': replay through the real hk.CacheManager (slower; use "
                        f"--limit, default {RUNTIME_LIMIT}) vs LRU and Belady on the same slice")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")


def load_trace(spec: str, limit=None, synthetic_requests: int = 4000, seed: int = 0):
    from hybridkv.bench.traces import TraceFormatError, read_mooncake, synthetic_trace
    if spec == "synthetic":
        return synthetic_trace(synthetic_requests, seed=seed).head(limit)
    if not os.path.isfile(spec):
        raise TraceFormatError("no such trace file", spec)
    return read_mooncake(spec, limit=limit)


def plot(points: list, out: str, title: str) -> None:
    """Hit rate vs capacity for ours / LRU / Belady -> PNG (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    caps = [p["capacity_blocks"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, get in (("ours", lambda p: p["ours"]["hit_rate"]),
                      ("LRU (vLLM-style)", lambda p: p["lru"]["hit_rate"]),
                      ("Belady (MIN)", lambda p: p["belady"]["hit_rate"])):
        ax.plot(caps, [get(p) for p in points], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel("token hit rate")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _fail(args, err: Exception) -> int:
    msg = f"{type(err).__name__}: {err}"
    if args.json:
        print(json.dumps({"error": msg}))
    else:
        print(f"hybridkv replay: {msg}", file=sys.stderr)
    return 2


def _text(r: dict) -> str:
    lines = [f"trace {r['trace']} ({r['requests']} requests)  layout {r['layout']}  "
             f"capacity {r['capacity_blocks']} blocks",
             f"{'':8}{'hit rate':>10}{'blocks':>9}{'ops/s':>11}{'p50 us':>9}{'p99 us':>9}"
             f"{'FLOPs saved':>13}"]
    for name in ("ours", "lru"):
        x = r[name]
        lines.append(f"{name:8}{x['hit_rate']:10.4f}{x['block_hit_rate']:9.4f}"
                     f"{x['ops_per_s']:11.0f}{x['latency_us']['p50']:9.1f}"
                     f"{x['latency_us']['p99']:9.1f}{x['flops_saved']:13.3e}")
    b = r["belady"]
    lines.append(f"{'belady':8}{b['hit_rate']:10.4f}{b['block_hit_rate']:9.4f}")
    lines.append(f"ours/Belady (blocks) {r['ours_over_belady']:.3f}   ours/LRU ops/s "
                 f"{r['ops_ratio_ours_over_lru']:.3f}   per-group hit tokens (ours) "
                 f"{r['ours']['group_hit_tokens']}")
    if "sim_ours" in r:
        lines.append(f"sim ours on the same slice: hit rate {r['sim_ours']['hit_rate']:.4f}   "
                     f"runtime pools {r['runtime_pools']}")
    lines.append(f"manager {r.get('manager', 'sim')}   vLLM baseline: skipped: "
                 f"{r.get('vllm', {}).get('skipped', '')}")
    return "\n".join(lines)


def _runtime_compare(args, trace, layout, progress) -> dict:
    from hybridkv.bench.managers import PolicyManager
    from hybridkv.bench.runtime import RuntimeManager, pretokenize, runtime_layout
    from hybridkv.bench.sim import compare, replay
    if args.limit is None:
        trace = trace.head(RUNTIME_LIMIT)
    toks = pretokenize(trace, runtime_layout(layout).vocab)
    lens = [r.input_length for r in trace.requests] or [1]
    made = []

    def factory(lay, cap):
        m = RuntimeManager(lay, cap, tokens=toks, mean_tokens=sum(lens) // len(lens),
                           max_tokens=max(lens))
        made.append(m)
        return m
    out = compare(trace, layout, args.capacity_blocks, progress, ours_factory=factory)
    sim = replay(trace, PolicyManager, layout, args.capacity_blocks)
    out["sim_ours"] = {"hit_rate": sim.hit_rate, "block_hit_rate": sim.block_hit_rate,
                       "ops_per_s": sim.ops_per_s}
    sz = made[-1].sizing
    out["runtime_pools"] = {"every_n": sz.every_n, "budget_bytes": sz.budget_bytes,
                            "bytes": sz.bytes, "refused": made[-1].refused,
                            "num_blocks": {f"{k}/{g}": n for (k, g), n in sz.sizes.items()}}
    return out


def run(args) -> int:
    from hybridkv.bench.baselines import CapacityError
    from hybridkv.bench.layouts import get_layout
    from hybridkv.bench.sim import compare
    from hybridkv.bench.traces import TraceFormatError
    try:
        if args.capacity_blocks < 0:
            raise CapacityError(args.capacity_blocks)
        trace = load_trace(args.trace, args.limit, args.synthetic_requests, args.seed)
        layout = get_layout(args.layout)
        progress = not args.no_progress and sys.stderr.isatty()
        if args.manager == "runtime":
            result = _runtime_compare(args, trace, layout, progress)
        else:
            result = compare(trace, layout, args.capacity_blocks, progress=progress)
        result["manager"] = args.manager
        result["vllm"] = vllm_status()
        if args.plot:
            caps = sorted(set(PLOT_CAPACITIES) | {args.capacity_blocks})
            pts = [result if c == args.capacity_blocks else compare(trace, layout, c)
                   for c in caps]
            plot(pts, args.plot, f"{trace.name}, layout {layout.name}")
            result["plot"] = args.plot
            result["sweep"] = [{"capacity_blocks": p["capacity_blocks"],
                                "ours": p["ours"]["hit_rate"], "lru": p["lru"]["hit_rate"],
                                "belady": p["belady"]["hit_rate"],
                                "ours_over_belady_tokens": p["ours_over_belady_tokens"],
                                "ops_ratio_ours_over_lru": p["ops_ratio_ours_over_lru"]}
                               for p in pts]
    except (TraceFormatError, CapacityError, ValueError, OSError) as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(result))
    else:
        print(_text(result))
    return 0
