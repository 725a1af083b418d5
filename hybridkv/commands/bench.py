"""`hybridkv bench allocator`: lookup + allocate + free ops/s of the runtime CacheManager on
a Mooncake trace, checked mode off vs on, and spec guards vs the same calls with every guard
stubbed to True (all measured in one run, on the same requests)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

NAME = "bench"
HELP = "benchmarks: `bench allocator` = CacheManager ops/s (checked off/on, guards stubbed)"
DEFAULT_TRACE = "/work/shared/traces/mooncake_conversation/conversation_trace.jsonl.gz"


def add_arguments(p) -> None:
    p.add_argument("what", choices=("allocator",))
    p.add_argument("--trace", default=DEFAULT_TRACE, help="Mooncake JSONL (plain or .gz)")
    p.add_argument("--limit", type=int, default=300, help="requests replayed per mode")
    p.add_argument("--checked-limit", type=int, default=20,
                   help="requests for checked mode (it sweeps every block after every call)")
    p.add_argument("--num-blocks", type=int, default=8192, help="blocks per pool")
    p.add_argument("--repeat", type=int, default=3,
                   help="passes per mode, interleaved; the best pass of each is reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")


@contextlib.contextmanager
def stubbed_guards():
    """Every spec guard the runtime calls replaced by ``True`` (table guards, funnel
    predicates, the launch re-check, admission).  Kept: state-based routing (an event still
    needs its source state) and guards that *choose* between two rows of one (state, event)
    (unpin: keep pinned vs back to ready) and the funnel's group intersection (plain ``all``)
    -- stubbing those would change decisions, not cost."""
    from hybridkv import alloc, lookup, pools, reads, tables
    from spec import state
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    for cls in state.MACHINES:
        t = tables.table_for(cls)
        patch(t, "rows", {k: (rows if len(rows) > 1 else [((), tgt) for _, tgt in rows])
                          for k, rows in t.rows.items()})
    yes = lambda *a, **k: True                                  # noqa: E731
    for name in ("can_hit_aligned", "can_hit_abi"):
        patch(lookup, name, yes)
    patch(lookup, "can_hit_groups", all)     # the intersection decides, it is not a check
    patch(lookup, "READY_CHECKS", {k: [] for k in lookup.READY_CHECKS})
    patch(pools, "can_hit_bytes", yes)
    patch(reads, "can_read_pinned", yes)
    patch(alloc, "can_admit", yes)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def layout():
    from hybridkv.layout import ModelLayout
    return ModelLayout.v4_mini(block_size=512, window=128, hca_ratio=128, vocab=32000)


def run_mode(prompts, num_blocks, checked=False):
    from hybridkv.errors import AdmissionRefused
    from hybridkv.manager import CacheManager
    m = CacheManager(layout(), num_blocks=num_blocks, checked=checked)
    clock = time.perf_counter
    total = hit_tokens = hits = refused = 0
    t_all = 0.0
    for rid, toks in enumerate(prompts):
        t0 = clock()
        plan = m.lookup(rid, toks)
        n = len(toks) - plan.reuse_tokens
        try:
            m.allocate(rid, n)
            m.commit(rid, n)
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


def run(args) -> int:
    from hybridkv.bench.traces import TraceFormatError, read_mooncake, request_token_ids
    if not os.path.isfile(args.trace):
        print(f"no such trace file: {args.trace}", file=sys.stderr)
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
        "lookup+allocate(+commit)+free = 3 ops", "checked_off": off, "checked_on": on,
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
