"""`hybridkv bench vs-vllm`: hybridkv's CacheManager and vLLM's KVCacheManager on the same
request streams, each side in its own process, interleaved rounds, p50/p99 per call type, hit
rates and the ratio table; plus (hybridkv only) decode p50 at 64k vs 2k tokens, the guard
overhead, the checked-mode cost and the time a 10**9-token allocation takes to be refused.
See hybridkv/bench/vs_vllm.py.

`hybridkv bench allocator`: lookup + allocate + commit + free ops/s of the CacheManager on a
Mooncake trace, checked mode off vs on, and spec guards vs the same calls with every guard
stubbed to True (all measured in one run, on the same requests).

`hybridkv bench floor`: the spec's guards and effects alone for one block's lifecycle, event
by event and as runs, beside the CacheManager's cost for the same blocks (hybridkv/bench/
floor.py)."""
from __future__ import annotations

import json
import os
import sys
import time

NAME = "bench"
HELP = ("benchmarks: `bench vs-vllm` = hybridkv vs vLLM's KV cache manager per call type; "
        "`bench allocator` = CacheManager ops/s (checked off/on, guards stubbed); "
        "`bench one-memory` = KV bytes held by requests sharing a prefix, bytes copied per "
        "hit, engine decode tokens/s at batch 1 vs 8; `bench floor` = the spec's guards and "
        "effects alone per block vs the CacheManager's cost per block")


def _names(choices):
    def parse(text):
        names = [n for n in text.split(",") if n]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            import argparse
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}: {text!r}")
        return names
    return parse


def _ints(n):
    def parse(text):
        try:
            vals = tuple(int(v) for v in text.split(","))
        except ValueError:
            vals = ()
        if len(vals) != n or min(vals) <= 0:
            import argparse
            raise argparse.ArgumentTypeError(f"{n} positive comma-separated ints: {text!r}")
        return vals
    return parse


def add_arguments(p) -> None:
    from hybridkv.bench.shipped import DEFAULT_TRACE, NAMED_TRACES
    from hybridkv.bench.vs_vllm import DEFAULT_BUDGET_MIB, PAIRINGS, STREAMS
    p.add_argument("what", choices=("vs-vllm", "allocator", "one-memory", "floor"))
    p.add_argument("--trace", default=DEFAULT_TRACE,
                   help="a shipped trace (" + ", ".join(NAMED_TRACES) + "; default "
                        f"{DEFAULT_TRACE}) or a Mooncake JSONL file (plain or .gz)")
    p.add_argument("--limit", type=int, default=300,
                   help="Mooncake requests (vs-vllm: the mooncake stream; allocator: per mode)")
    p.add_argument("--checked-limit", type=int, default=20,
                   help="requests for checked mode (it sweeps every block after every call)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    g = p.add_argument_group("vs-vllm")
    g.add_argument("--streams", type=_names(STREAMS), default=["mooncake", "decode"],
                   help=f"comma-separated, of {', '.join(STREAMS)} (default mooncake,decode)")
    g.add_argument("--pairings", type=_names(PAIRINGS), default=list(PAIRINGS),
                   help="comma-separated: v4-mini (hybridkv v4-mini vs vLLM full+swa), full "
                        "(full vs full); default both")
    g.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds (hybridkv process, vLLM process); medians reported")
    g.add_argument("--budget-mib", type=float, default=DEFAULT_BUDGET_MIB,
                   help="KV byte budget per side (sets num_blocks on both sides)")
    g.add_argument("--decode-steps", type=int, default=4,
                   help="decode steps per request of the mooncake stream")
    g.add_argument("--decode-requests", type=int, default=32, help="decode stream: requests")
    g.add_argument("--decode-len", type=int, default=256, help="decode stream: steps each")
    g.add_argument("--device", choices=("cpu", "meta"), default="cpu",
                   help="hybridkv pool memory (meta: bookkeeping only)")
    g.add_argument("--no-extras", dest="extras", action="store_false",
                   help="skip the hybridkv-only measurements (64k/2k decode, guards, checked, "
                        "10**9 refusal)")
    g.add_argument("--no-footprint", dest="footprint", action="store_false",
                   help="skip the bookkeeping bytes per block pass (one untimed process per "
                        "side and job, under tracemalloc)")
    g.add_argument("--context", type=_ints(3), default=(2048, 65536, 256),
                   help="SHORT,LONG,STEPS of the decode-at-context extra (default "
                        "2048,65536,256)")
    g.add_argument("--refusal-reps", type=int, default=20,
                   help="allocate(rid, 10**9) calls timed (extras)")
    g.add_argument("--timeout", type=float, default=600, help="seconds per process")
    g.add_argument("--workdir", default=None, help="where the stream files go (a temp dir)")
    g = p.add_argument_group("allocator")
    g.add_argument("--num-blocks", type=int, default=8192, help="blocks per pool")
    g.add_argument("--repeat", type=int, default=3,
                   help="passes per mode, interleaved; the best pass of each is reported")


def stubbed_guards():
    """Every spec guard the runtime calls stubbed to True (hybridkv_side.stubbed_guards)."""
    from hybridkv.bench.hybridkv_side import stubbed_guards as stub
    return stub()


def layout():
    from hybridkv.layout import ModelLayout
    return ModelLayout.v4_mini(block_size=512, window=128, hca_ratio=128, vocab=32000)


def run_mode(prompts, num_blocks, checked=False):
    from hybridkv.cache.manager import CacheManager
    from hybridkv.errors import AdmissionRefused
    m = CacheManager(layout(), num_blocks=num_blocks, checked=checked)
    clock = time.perf_counter
    total = hit_tokens = hits = refused = 0
    t_all = 0.0
    for rid, toks in enumerate(prompts):
        t0 = clock()
        plan = m.lookup(rid, toks)
        try:
            a = m.allocate(rid, len(toks) - plan.reuse_tokens)
            L = a.start              # commits end on each checkpoint (else it is dropped)
            for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
                m.commit(rid, P - L)
                L = P
        except AdmissionRefused:
            refused += 1
        m.free(rid)
        t_all += clock() - t0
        total += len(toks)
        hit_tokens += plan.reuse_tokens
        hits += plan.reuse_tokens > 0
    ops = 3 * len(prompts)
    return {"requests": len(prompts), "ops": ops, "seconds": t_all,
            "ops_per_s": ops / t_all if t_all else 0.0, "hit_requests": hits,
            "hit_token_rate": hit_tokens / total if total else 0.0, "refused": refused,
            "transitions": sum(m.metrics.transitions.values())}


def trace_file(spec: str) -> str | None:
    """The file of --trace (a shipped trace's name or a path); None, with the reason on stderr,
    when there is none."""
    from hybridkv.bench.shipped import ShippedTraceMissing, trace_path
    try:
        path = trace_path(spec)
    except ShippedTraceMissing as e:
        print(e, file=sys.stderr)
        return None
    if not os.path.isfile(path):
        print(f"no such trace file: {spec}", file=sys.stderr)
        return None
    return path


def run(args) -> int:
    if args.what == "vs-vllm":
        return run_vs_vllm(args)
    if args.what == "one-memory":
        return run_one_memory(args)
    if args.what == "floor":
        return run_floor(args)
    return run_allocator(args)


def run_floor(args) -> int:
    from hybridkv.bench import floor
    out = floor.run_all()
    print(json.dumps(out) if args.json else floor.table(out))
    return 0


def run_one_memory(args) -> int:
    import torch

    from hybridkv.bench import one_memory
    torch.set_num_threads(1)
    out = one_memory.run_all()
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'N':>3} {'held KB':>9} {'prefix KB':>10} {'per req KB':>11} "
          f"{'private copy KB':>16} {'before KB':>10} {'before/after':>13}")
    for r in out["sharing"]:
        print(f"{r['requests']:>3} {r['kv_bytes_held'] / 1e3:>9.1f} "
              f"{r['cached_prefix_bytes'] / 1e3:>10.1f} {r['per_request_bytes'] / 1e3:>11.1f} "
              f"{r['private_copy_bytes'] / 1e3:>16.1f} {r['before_bytes'] / 1e3:>10.1f} "
              f"{r['before_over_after']:>13.2f}")
    for r in out["per_hit"]:
        print(f"hit at {r['resumed_at']:>5}: {r['bytes_copied']} bytes copied (before "
              f"{r['before_bytes_copied']}: ratio {r['before_over_after']:.2f})")
    for r in out["batching"]:
        print(f"decode {r['backend']}: {r['tokens_per_s_batch1']:.1f} tok/s at batch 1, "
              f"{r['tokens_per_s_batch' + str(r['batch'])]:.1f} at batch {r['batch']} "
              f"(ratio {r['ratio']:.2f})")
    return 0


def run_vs_vllm(args) -> int:
    from hybridkv.bench import vs_vllm
    if "mooncake" in args.streams:
        args.trace = trace_file(args.trace)
        if args.trace is None:
            return 2
    if min(args.limit, args.rounds, args.decode_requests, args.checked_limit,
           args.refusal_reps) <= 0 or \
            min(args.decode_steps, args.decode_len) < 0 or args.budget_mib <= 0:
        print("--limit, --rounds, --decode-requests, --checked-limit, --refusal-reps and "
              "--budget-mib must be positive, --decode-steps and --decode-len >= 0",
              file=sys.stderr)
        return 2
    try:
        out = vs_vllm.run(args)
    except ValueError as e:             # e.g. a budget below the working set
        print(f"bench vs-vllm: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        print(vs_vllm.report(out))
    return 1 if out["errors"] else 0


def run_allocator(args) -> int:
    from hybridkv.bench.traces import TraceFormatError, read_mooncake, request_token_ids
    args.trace = trace_file(args.trace)
    if args.trace is None:
        return 2
    if args.limit <= 0 or args.num_blocks <= 0:
        print("--limit and --num-blocks must be positive", file=sys.stderr)
        return 2
    try:
        trace = read_mooncake(args.trace, limit=args.limit)
    except TraceFormatError as e:
        print(f"bad trace: {e}", file=sys.stderr)
        return 2
    prompts = [request_token_ids(trace, r, 32000) for r in trace.requests]
    n_checked = min(args.checked_limit or len(prompts), len(prompts))
    print(f"replaying {len(prompts)} requests ({n_checked} in checked mode)", file=sys.stderr)
    best = lambda a, b: b if a is None or b["ops_per_s"] > a["ops_per_s"] else a  # noqa: E731
    off = stub = off_small = on = None
    for _ in range(max(1, args.repeat)):         # interleaved: drift hits every mode alike
        off = best(off, run_mode(prompts, args.num_blocks))
        with stubbed_guards():
            stub = best(stub, run_mode(prompts, args.num_blocks))
        off_small = best(off_small, run_mode(prompts[:n_checked], args.num_blocks))
        on = best(on, run_mode(prompts[:n_checked], args.num_blocks, checked=True))
    out = {
        "trace": os.path.basename(args.trace), "layout": "v4-mini/512", "repeat": args.repeat,
        "ops_per_request":
        "lookup+allocate(+commits)+free = 3 ops", "checked_off": off, "checked_on": on,
        "guards_stubbed": stub,
        "checked_off_same_requests": off_small,
        "checked_on_over_off": on["ops_per_s"] / off_small["ops_per_s"],
        "guard_overhead_ratio": stub["ops_per_s"] / off["ops_per_s"],   # > 1: guards cost
        "same_hits_with_stubs": (stub["hit_requests"], stub["hit_token_rate"])
        == (off["hit_requests"], off["hit_token_rate"]),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k in ("checked_off", "checked_on", "guards_stubbed"):
            v = out[k]
            print(f"{k:15s} {v['ops_per_s']:10.1f} ops/s  ({v['requests']} req, "
                  f"hit tokens {v['hit_token_rate']:.3f})")
        print(f"checked on / off: {out['checked_on_over_off']:.3f}   "
              f"stubbed / guarded (guard overhead): {out['guard_overhead_ratio']:.3f}")
    return 0


def main(argv=None) -> int:
    """`python -m hybridkv.commands.bench ...`: this subcommand alone (the same parser and run
    as `hybridkv bench ...`, without importing the other subcommands)."""
    import argparse
    parser = argparse.ArgumentParser(prog="hybridkv bench", description=HELP)
    add_arguments(parser)
    return int(run(parser.parse_args(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
