"""`hybridkv replay TRACE|synthetic`: replay a serving trace through the real CacheManager (ours),
the vLLM-style LRU baseline and Belady's MIN, at one capacity (or a 1k/10k/100k sweep with
--plot). TRACE is a shipped trace's name (bench.shipped.NAMED_TRACES: mooncake-conversation,
mooncake-synthetic) or a path; how timestamps and hash ids are read: bench/traces.py."""
from __future__ import annotations

import json
import os
import sys

NAME = "replay"
HELP = ("replay a Mooncake-format trace (or 'synthetic') through hk.CacheManager at a capacity: "
        "token hit rate, FLOPs saved, ops/s and latency for ours vs vLLM-style LRU vs Belady")
PLOT_CAPACITIES = (1000, 10000, 100000)
MEMORY = {"auto": None, "arena": True, "fixed": False}     # --memory -> RuntimeManager(arena=)


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
    from hybridkv.bench.runtime import CHUNK_TOKENS, LAYOUT_NAMES
    from hybridkv.bench.shipped import NAMED_TRACES
    from hybridkv.bench.traces import TIMESTAMP_UNITS
    p.add_argument("trace", help="a shipped trace (" + ", ".join(NAMED_TRACES) + "), "
                   "'synthetic', or a Mooncake-format JSONL file (plain or .gz)")
    p.add_argument("--layout", default="full", choices=LAYOUT_NAMES)
    p.add_argument("--capacity-blocks", type=int, default=10000,
                   help="cache size in 512-token blocks of the layout's chain bytes")
    p.add_argument("--block-tokens", type=int, default=512, metavar="N",
                   help="tokens each hash id of the trace stands for (Mooncake: 512); ours pages "
                        "at N tokens (v4-mini: N rounded up to a multiple of 128)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--timestamp-unit", choices=TIMESTAMP_UNITS, default="auto",
                   help="unit of the trace's timestamps (auto: ns when the last timestamp is "
                        ">= 1e13 or the span >= 1e10, else ms)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a request whose hash-id count is not "
                        "ceil(input_length / block tokens) (default: use the ids, count them)")
    p.add_argument("--synthetic-requests", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator")
    p.add_argument("--every-n", type=int, default=None, metavar="TOKENS",
                   help="also checkpoint every TOKENS tokens (a multiple of --block-tokens; "
                        "default: tuned per layout and capacity, 0 = retention points only)")
    p.add_argument("--memory", choices=MEMORY, default="auto",
                   help="arena: one block arena whose pages every kind shares; fixed: per-pool "
                        "sizes split from the byte budget by the mean prompt; auto (default): "
                        "the arena where its pages pad nothing (full), else fixed (v4-mini)")
    p.add_argument("--snapshot-fraction", type=float, default=None,
                   help="with fixed pools: share of the byte budget (after the running "
                        "request's working objects) for checkpoint pools (default: tuned per "
                        "layout and capacity)")
    p.add_argument("--chunk-tokens", type=int, default=CHUNK_TOKENS,
                   help="prefill chunk: one allocate per chunk")
    p.add_argument("--no-hints", dest="hints", action="store_false",
                   help="do not pass each request's output-length class as the lookup hint")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also sweep capacities 1k/10k/100k (+C) and plot hit rate vs capacity")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")


class ReplayArgumentError(ValueError):
    """A replay option is out of range. Carries `value`."""

    def __init__(self, message: str, value):
        super().__init__(f"{message}: {value!r}")
        self.value = value


def load_trace(spec: str, limit=None, synthetic_requests: int = 4000, seed: int = 0,
               block_tokens: int = 512, strict: bool = False, unit: str = "auto"):
    """'synthetic', a shipped trace's name or a path -> Trace (bench.traces.read_mooncake)."""
    from hybridkv.bench.shipped import NAMED_TRACES, trace_path
    from hybridkv.bench.traces import TraceFormatError, read_mooncake, synthetic_trace
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise TraceFormatError("block tokens must be an int >= 1", block_tokens)
    if spec == "synthetic":
        return synthetic_trace(synthetic_requests, seed=seed,
                               block_size=block_tokens).head(limit)
    path = trace_path(spec)
    if not os.path.isfile(path):
        raise TraceFormatError("no such trace file (nor a trace name: synthetic, "
                               + ", ".join(NAMED_TRACES) + ")", spec)
    return read_mooncake(path, block_size=block_tokens, limit=limit, strict=strict, unit=unit)


def reading_report(trace) -> dict:
    """How the trace was read: the timestamps' unit and span, and the requests whose hash-id
    count disagreed with their input length (their lengths were moved to the ids)."""
    stamps = [r.timestamp_ms for r in trace.requests]
    added, removed = trace.reconciled_tokens()
    return {"timestamp_unit": trace.timestamp_unit,
            "span_s": (stamps[-1] - stamps[0]) / 1000 if stamps else 0.0,
            "hash_id_count_mismatches": len(trace.reconciled),
            "reconciled_tokens_added": added, "reconciled_tokens_removed": removed}


def runtime_options(args) -> dict:
    """RuntimeManager keyword arguments from the command line (None: the tuned default for the
    layout and capacity, bench.sizing.tuned)."""
    opts = {"every_n": args.every_n, "snapshot_fraction": args.snapshot_fraction,
            "chunk_tokens": args.chunk_tokens, "hints": args.hints,
            "arena": MEMORY[args.memory]}
    block = args.block_tokens if args.block_tokens >= 1 else 512   # (a bad one: the loader's)
    if args.every_n is not None and (args.every_n < 0 or args.every_n % block):
        raise ReplayArgumentError(f"--every-n must be a multiple of --block-tokens ({block}), "
                                  ">= 0", args.every_n)
    if args.snapshot_fraction is not None and not 0.0 <= args.snapshot_fraction < 1.0:
        raise ReplayArgumentError("--snapshot-fraction must be in [0, 1)",
                                  args.snapshot_fraction)
    if args.chunk_tokens < 1:
        raise ReplayArgumentError("--chunk-tokens must be >= 1", args.chunk_tokens)
    return opts


def plot(points: list, out: str, title: str) -> None:
    """Hit rate vs capacity for ours / LRU / Belady -> PNG (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    caps = [p["capacity_blocks"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, get in (("ours", lambda p: p["ours"]["hit_rate"]),
                      ("LRU (vLLM-style)", lambda p: p["lru"]["hit_rate"]),
                      ("Belady (MIN, trace blocks)", lambda p: p["belady"]["hit_rate"]),
                      ("unbounded, engine rule", lambda p: p["engine_bound"])):
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


def _memory_text(rt: dict) -> str:
    """One line: the arena's pages (held per kind at the end, padding waste) or the pools."""
    arena = rt["arena"]
    if arena is None:
        split = (f"snapshot fraction {rt['snapshot_fraction']}"
                 if rt["snapshot_fraction"] is not None
                 else f"{rt['checkpoints_per_chain']:.3f} checkpoint sets per chain unit")
        return f"fixed pools ({split}) {rt['num_blocks']}"
    return (f"arena {arena['pages']} pages of {arena['page_bytes']} B, padding waste "
            f"{arena['padding_waste']['held']:.1%} of the held pages; pages held at the end "
            f"{arena['used']}")


def _text(r: dict) -> str:
    rt = r["runtime"]
    lines = [(f"trace {r['trace']} ({r['requests']} requests, {r['block_tokens']}-token blocks)"
              f"  layout {r['layout']}  capacity {r['capacity_blocks']} blocks"),
             (f"{'':8}{'hit rate':>10}{'blocks':>9}{'req/s':>9}{'ops/s':>10}{'p50 us':>9}"
              f"{'p99 us':>9}{'FLOPs saved':>13}")]
    for name, label in (("ours", "ours"), ("lru", "lru"), ("lru_trace_blocks", "lru-blk")):
        x = r[name]
        lines.append(f"{label:8}{x['hit_rate']:10.4f}{x['block_hit_rate']:9.4f}"
                     f"{x['requests_per_s']:9.0f}{x['ops_per_s']:10.0f}"
                     f"{x['latency_us']['p50']:9.1f}{x['latency_us']['p99']:9.1f}"
                     f"{x['flops_saved']:13.3e}")
    b = r["belady"]
    lines.append(f"{'belady':8}{b['hit_rate']:10.4f}{b['block_hit_rate']:9.4f}")
    lines.append(f"{'bound':8}{r['engine_bound']:10.4f}   (unbounded cache, engine rule)")
    rd = r["reading"]
    lines.append(f"timestamps read in {rd['timestamp_unit']}, span {rd['span_s']:.1f} s; "
                 f"{rd['hash_id_count_mismatches']} requests with a hash-id count other than "
                 f"ceil(input_length / {r['block_tokens']}) (lengths moved to the ids: "
                 f"+{rd['reconciled_tokens_added']} / -{rd['reconciled_tokens_removed']} "
                 "tokens)")
    lines.append("lru counts hits as an engine uses them (whole blocks, last token computed), "
                 "like ours; lru-blk (lru_trace_blocks) and belady count every cached trace block")
    lines.append(f"ours = hk.CacheManager ({rt['layout']}, device {rt['device']}, blocks of "
                 f"{rt['block_tokens']} tokens), every_n {rt['every_n']}, forks "
                 f"{'on' if rt['forks'] else 'off'}, chunk "
                 f"{rt['chunk_tokens']}, refused {rt['refused']}, request hints "
                 f"{'on' if rt['hints'] else 'off'}")
    lines.append(_memory_text(rt))
    lines.append(f"per-group hit tokens (ours) {r['ours']['group_hit_tokens']}")
    lines.append(f"vLLM baseline: skipped: {r.get('vllm', {}).get('skipped', '')}")
    return "\n".join(lines)


def run(args) -> int:
    from hybridkv.bench.baselines import CapacityError
    from hybridkv.bench.replay import compare
    from hybridkv.bench.traces import TraceFormatError
    try:
        if args.capacity_blocks < 0:
            raise CapacityError(args.capacity_blocks)
        trace = load_trace(args.trace, args.limit, args.synthetic_requests, args.seed,
                           args.block_tokens, args.strict, args.timestamp_unit)
        opts = runtime_options(args)
        progress = not args.no_progress and sys.stderr.isatty()
        result = compare(trace, args.layout, args.capacity_blocks, progress, **opts)
        result["reading"] = reading_report(trace)
        result["vllm"] = vllm_status()
        if args.plot:
            caps = sorted(set(PLOT_CAPACITIES) | {args.capacity_blocks})
            pts = [result if c == args.capacity_blocks else
                   compare(trace, args.layout, c, progress, **opts) for c in caps]
            plot(pts, args.plot, f"{trace.name}, layout {args.layout}")
            result["plot"] = args.plot
            result["sweep"] = [{"capacity_blocks": p["capacity_blocks"],
                                "ours": p["ours"]["hit_rate"], "lru": p["lru"]["hit_rate"],
                                "lru_trace_blocks": p["lru_trace_blocks"]["hit_rate"],
                                "belady": p["belady"]["hit_rate"],
                                "engine_bound": p["engine_bound"],
                                "ours_requests_per_s": p["ours"]["requests_per_s"],
                                "ours_ops_per_s": p["ours"]["ops_per_s"],
                                "refused": p["runtime"]["refused"]}
                               for p in pts]
    except (TraceFormatError, CapacityError, ValueError, OSError) as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(result))
    else:
        print(_text(result))
    return 0


if __name__ == "__main__":          # `python -m hybridkv.commands.replay ...`: this command alone
    import argparse
    _parser = argparse.ArgumentParser(prog="hybridkv replay", description=HELP)
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
