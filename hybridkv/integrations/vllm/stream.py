"""The Mooncake stream through vLLM's real Scheduler, stock vs hybridkv, per model shape.

    scripts/vllm_stream [--shapes full,full+swa,v4] [--requests 300] [--trace NAME] [--json]

For each shape (stream_setup.SHAPES) the first N requests of a Mooncake trace (``--trace``:
mooncake-conversation, the default, mooncake-synthetic, or a path) run through vLLM 0.33.0's
Scheduler (stream_run.StreamRun: schedule() + update_from_output() with synthetic model
outputs), once with vLLM's KVCacheManager ("stock") and once with hybridkv's ("ours",
hybridkv.integrations.vllm.Scheduler), at the same ``num_blocks``. Per side: prefix-hit tokens
the Scheduler adopted (at first admissions, and at re-admissions after a preemption),
preemptions, steps, the step time (schedule + update_from_output) p50 / p99, and the arrival
time (the Request made, vLLM hashing its blocks, and added to the Scheduler, hybridkv
preparing it: outside the steps on both sides) p50 and total; the ratio ours / stock comes
from this one run.  And where the step time goes: each side's ``allocate_slots`` calls by what
they do (a prefill chunk; a decode step within a block, completing one or opening one:
stream_run.call_kind), their count, p50 and total.  Then every request whose first-admission
hit differs, with the group(s) that stopped the shorter side (stream_audit), and every stock
admission whose resume point hybridkv's checkpoint rule finds incomplete in the blocks vLLM
handed over.  Imports vLLM: run it in the vLLM venv.
"""
import argparse
import gc
import json
import os
import platform
import sys

from hybridkv.bench.percentile import summarize
from hybridkv.bench.shipped import trace_path
from hybridkv.bench.traces import read_mooncake, request_token_ids
from hybridkv.integrations.vllm.specs import group_roles
from hybridkv.integrations.vllm.stream_audit import OursAudit, StockAudit
from hybridkv.integrations.vllm.stream_run import CALL_KINDS, StreamRequest, StreamRun
from hybridkv.integrations.vllm.stream_setup import SHAPES, build_scheduler

# num_blocks per shape: small enough that the stock side preempts or evicts on 300 requests
DEFAULT_NUM_BLOCKS = {"full": 20000, "full+swa": 20000, "v4": 12000}
MAX_MODEL_LEN = 131072            # the longest of the first 300 prompts (120633) + its output
SIDES = ("stock", "ours")


def mooncake_requests(n, trace="mooncake-conversation"):
    """The first ``n`` requests of a Mooncake trace, prompts expanded to token ids."""
    t = read_mooncake(trace_path(trace), limit=n)
    return [StreamRequest(f"r{i}", r.timestamp_ms, request_token_ids(t, r), r.output_length,
                          tuple(r.hash_ids)) for i, r in enumerate(t.requests)]


def run_side(side, shape, requests, num_blocks, ms_per_step, max_num_seqs):
    """One side's StreamResult and its manager's description."""
    scheduler, hasher = build_scheduler(side, shape, num_blocks, MAX_MODEL_LEN, max_num_seqs)
    manager = scheduler.kv_cache_manager
    audit = StockAudit(manager, scheduler.hash_block_size) if side == "stock" else \
        OursAudit(manager)
    run = StreamRun(scheduler, hasher, requests, ms_per_step, explain=audit)
    gc.collect()
    gc.freeze()                   # as vLLM's EngineCore does after start-up
    try:
        result = run.run()
    finally:
        gc.unfreeze()
    about = {"block_size": scheduler.block_size, "hash_block_size": scheduler.hash_block_size,
             "groups": [group_roles(g) for g in manager.kv_cache_config.kv_cache_groups]}
    return result, about


def side_summary(result):
    first = [a for a in result.admissions if not a.resumed]
    again = [a for a in result.admissions if a.resumed]
    steps, arrivals = summarize(result.step_ns), summarize(result.arrival_ns)
    return {"hit_tokens": sum(a.hit_tokens for a in result.admissions),
            "first_hit_tokens": sum(a.hit_tokens for a in first),
            "resumed_hit_tokens": sum(a.hit_tokens for a in again),
            "admissions": len(result.admissions), "preemptions": result.preemptions,
            "evictions": result.evictions,
            "finished": result.finished, "refused": len(result.refused),
            "steps": result.steps,
            "step_p50_us": steps["p50"], "step_p99_us": steps["p99"],
            "arrival_p50_us": arrivals["p50"], "arrival_total_ms": round(
                sum(result.arrival_ns) / 1e6, 1),
            "wall_s": round(result.wall_s, 2),
            "calls": {kind: {**summarize(ns), "total_ms": round(sum(ns) / 1e6, 1)}
                      for kind, ns in result.call_ns.items()}}


def differences(requests, stock, ours, roles):
    """Requests whose first-admission hit differs: the shorter side's groups below the
    longer side's hit (each side's own cache state) with what they hold, ours' funnel
    rejections, and why hybridkv stopped short (its chain cached past the longer hit: only a
    window checkpoint was missing there)."""
    first = {side: {a.request_id: a for a in r.admissions if not a.resumed}
             for side, r in (("stock", stock), ("ours", ours))}
    out = []
    for spec in requests:
        s, o = first["stock"].get(spec.request_id), first["ours"].get(spec.request_id)
        if s is None or o is None or s.hit_tokens == o.hit_tokens:
            continue
        longer, shorter = (s, o) if s.hit_tokens > o.hit_tokens else (o, s)
        hits = (shorter.why or {}).get("group_hits")
        short_groups = None if hits is None else \
            [i for i, h in enumerate(hits) if h < longer.hit_tokens]
        chain = (o.why or {}).get("chain_tokens")
        why = None
        rejected = [r for r in (o.why or {}).get("rejections", []) if r["H"] == s.hit_tokens]
        if shorter is o and rejected and all(r["check"] == "readable" for r in rejected):
            why = ("in flight: the stock hit's blocks were still being written by a running "
                   "request (hybridkv resumes only on sealed state; vLLM shares them)")
        elif shorter is o and chain is not None:
            why = "no hybridkv checkpoint (window state) at the stock hit" if \
                chain >= s.hit_tokens else "chain blocks below the stock hit not cached"
        out.append({"request": spec.request_id, "prompt_tokens": len(spec.prompt),
                    "prompt_blocks": list(spec.hash_ids), "stock_hit": s.hit_tokens,
                    "ours_hit": o.hit_tokens,
                    "shorter": "ours" if shorter is o else "stock",
                    "groups_below_longer_hit": short_groups,
                    "their_roles": None if short_groups is None else
                    [roles[i] for i in short_groups],
                    "ours_chain_tokens": chain, "ours_short_because": why,
                    "ours_rejections": (o.why or {}).get("rejections", [])})
    return out


def stock_incomplete(stock, requests):
    prompts = {r.request_id: r for r in requests}
    return [{"request": a.request_id, "hit": a.hit_tokens, "resumed": a.resumed,
             "prompt_blocks": list(prompts[a.request_id].hash_ids),
             "incomplete": a.why["incomplete"]}
            for a in stock.admissions if a.why and a.why.get("incomplete")]


def run_shape(shape, requests, num_blocks, ms_per_step, max_num_seqs):
    results, about = {}, {}
    for side in SIDES:
        results[side], about[side] = run_side(side, shape, requests, num_blocks, ms_per_step,
                                              max_num_seqs)
    summary = {side: side_summary(results[side]) for side in SIDES}
    ratio = {k: _ratio(summary["ours"][k], summary["stock"][k])
             for k in ("step_p50_us", "step_p99_us", "hit_tokens", "arrival_p50_us",
                       "arrival_total_ms")}
    ratio["calls_p50"] = {kind: _ratio(summary["ours"]["calls"][kind]["p50"],
                                       summary["stock"]["calls"][kind]["p50"])
                          for kind in CALL_KINDS}
    return {"num_blocks": num_blocks, "setup": about, **summary, "ratio_ours_stock": ratio,
            "differences": differences(requests, results["stock"], results["ours"],
                                       about["stock"]["groups"]),
            "stock_incomplete": stock_incomplete(results["stock"], requests)}


def _ratio(ours, stock):
    return round(ours / stock, 3) if ours is not None and stock else None


def machine():
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"platform": platform.platform(), "cpu": platform.machine(),
            "cores": os.cpu_count(), "loadavg_at_end": load, "gpu": None,
            "python": platform.python_version()}


def table(report):
    lines = [f"{'shape':<9} {'side':<6} {'hit tok':>9} {'first':>9} {'resumed':>8} "
             f"{'preempt':>7} {'evicted':>7} {'steps':>6} {'p50 us':>8} {'p99 us':>9} "
             f"{'arrive us':>9}"]
    for shape, r in report["shapes"].items():
        for side in SIDES:
            s = r[side]
            lines.append(f"{shape:<9} {side:<6} {s['hit_tokens']:>9} {s['first_hit_tokens']:>9} "
                         f"{s['resumed_hit_tokens']:>8} {s['preemptions']:>7} "
                         f"{s['evictions']:>7} {s['steps']:>6} "
                         f"{s['step_p50_us']:>8} {s['step_p99_us']:>9} "
                         f"{s['arrival_p50_us']:>9}")
        q = r["ratio_ours_stock"]
        lines.append(f"{shape:<9} ours/stock: hit tokens {q['hit_tokens']}, step p50 "
                     f"{q['step_p50_us']}, p99 {q['step_p99_us']}, arrival p50 "
                     f"{q['arrival_p50_us']} (total {r['ours']['arrival_total_ms']} vs "
                     f"{r['stock']['arrival_total_ms']} ms) (num_blocks "
                     f"{r['num_blocks']}, prompts refused as longer than max_model_len: "
                     f"{r['stock']['refused']}); requests whose first hit differs: "
                     f"{len(r['differences'])}; stock admissions hybridkv's rule finds "
                     f"incomplete: {len(r['stock_incomplete'])}")
        lines.append(f"{shape:<9} allocate_slots by what it does, stock / ours: " + "; ".join(
            f"{kind} {r['stock']['calls'][kind]['count']} calls, p50 "
            f"{r['stock']['calls'][kind]['p50']} / {r['ours']['calls'][kind]['p50']} us "
            f"({q['calls_p50'][kind]}), total {r['stock']['calls'][kind]['total_ms']} / "
            f"{r['ours']['calls'][kind]['total_ms']} ms" for kind in CALL_KINDS))
    return "\n".join(lines)


def parse_blocks(text):
    out = dict(DEFAULT_NUM_BLOCKS)
    for part in filter(None, (text or "").split(",")):
        shape, _, n = part.partition("=")
        if shape not in SHAPES or not n.isdigit():
            raise argparse.ArgumentTypeError(f"--num-blocks wants SHAPE=N,...: {part!r}")
        out[shape] = int(n)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="vllm_stream", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--trace", default="mooncake-conversation",
                   help="a shipped Mooncake trace's name (mooncake-conversation, "
                        "mooncake-synthetic) or a path")
    p.add_argument("--num-blocks", type=parse_blocks, default=parse_blocks(""),
                   help="SHAPE=N,... (defaults: %s)" % DEFAULT_NUM_BLOCKS)
    p.add_argument("--ms-per-step", type=float, default=50.0)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        p.error(f"unknown shapes {bad}: choose from {SHAPES}")
    requests = mooncake_requests(args.requests, args.trace)
    report = {"requests": len(requests), "trace": args.trace,
              "ms_per_step": args.ms_per_step, "max_num_seqs": args.max_num_seqs,
              "shapes": {s: run_shape(s, requests, args.num_blocks[s], args.ms_per_step,
                                      args.max_num_seqs) for s in shapes}}
    report["machine"] = machine()
    print(json.dumps(report) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
