"""`hybridkv demo`: a multi-turn, multi-tenant conversation workload through the engine."""
import json
import sys
import tempfile
import time

NAME = "demo"
HELP = ("run a multi-turn, multi-tenant chat workload through hk.Engine on V4Mini (CPU, local "
        "disk tier in a temp dir): per-group hit lengths, tokens reused vs recomputed, and "
        "every output checked against a cold run with the same chunking")


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=2, help="per tenant")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--draft-tokens", type=int, default=2,
                        help="n-gram draft tokens per decode step (0: no speculation)")
    parser.add_argument("--backend", default="torch", choices=("torch", "triton"))
    parser.add_argument("--seed", type=int, default=0)


def workload(tenants, convs, seed=0):
    """Per tenant a 32-token system prompt (the same tokens for every tenant: only the salt
    keeps them apart) and per conversation a distinct first user message."""
    import random
    rnd = random.Random(seed)
    system = [rnd.randrange(256) for _ in range(32)]
    return [(f"tenant{t}".encode(), [system + [rnd.randrange(256) for _ in range(6)]
                                      for _ in range(convs)]) for t in range(tenants)]


def run(args):
    import torch

    import hybridkv as hk
    from hybridkv.engine import Engine, cold_mismatches

    torch.set_num_threads(1)
    t0 = time.time()
    model = hk.V4Mini(seed=args.seed, backend=args.backend)
    rows, tot = [], {"reuse_tokens": 0, "recomputed_tokens": 0, "mismatches": 0,
                     "plan_reuse_tokens": 0, "preemptions": 0, "drafted": 0, "accepted": 0}
    with tempfile.TemporaryDirectory(prefix="hybridkv-demo-") as d:
        disk = hk.DiskTier(d, capacity_bytes=64 << 20)
        cache = hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=48, disk=disk)
        eng = Engine(model, cache, num_draft_tokens=args.draft_tokens)
        convs = [(salt, c, p) for salt, ps in workload(args.tenants, args.conversations, args.seed)
                 for c, p in enumerate(ps)]
        hist = [list(p) for _, _, p in convs]
        for turn in range(args.turns):
            if turn:
                for i, h in enumerate(hist):
                    h += [(7 * turn + 13 * i + k) % 256 for k in range(5)]   # next user message
            outs = eng.generate(hist, args.new_tokens, salts=[s for s, _, _ in convs])
            for (salt, c, _), o, h, out in zip(convs, eng.last_outputs, hist, outs):
                bad = cold_mismatches(model, o)
                plan = o.hits[0]
                rows.append({"turn": turn, "tenant": salt.decode(), "conv": c,
                             "prompt": len(h), "hit": plan.reuse_tokens,
                             "outcome": plan.outcome, "group_hits": dict(plan.group_hits),
                             "reused": o.reused_tokens, "recomputed": o.recomputed_tokens,
                             "mismatches": bad})
                tot["reuse_tokens"] += o.reused_tokens
                tot["recomputed_tokens"] += o.recomputed_tokens
                tot["plan_reuse_tokens"] += sum(p.reuse_tokens for p in o.hits)
                tot["mismatches"] += bad
                tot["preemptions"] += o.preemptions
                tot["drafted"] += o.drafted
                tot["accepted"] += o.accepted
                h += out
            cache.check_invariants()
        disk.close()
    tot.update(requests=len(rows), graph_captures=eng.graph.captures,
               graph_replays=eng.graph.replays, invariants="ok",
               seconds=round(time.time() - t0, 3), requests_detail=rows)
    if args.json:
        print(json.dumps(tot))
    else:
        print(f"{'turn':>4} {'tenant':<8} {'conv':>4} {'prompt':>6} {'hit':>4} {'outcome':<8} "
              f"{'group hits':<28} {'reused':>6} {'recomp':>6} {'bad':>3}")
        for r in rows:
            gh = " ".join(f"{k}={v}" for k, v in r["group_hits"].items())
            print(f"{r['turn']:>4} {r['tenant']:<8} {r['conv']:>4} {r['prompt']:>6} {r['hit']:>4} "
                  f"{r['outcome']:<8} {gh:<28} {r['reused']:>6} {r['recomputed']:>6} "
                  f"{r['mismatches']:>3}")
        print(f"\ntokens reused {tot['reuse_tokens']}, recomputed {tot['recomputed_tokens']}, "
              f"mismatches vs cold run {tot['mismatches']}, preemptions {tot['preemptions']}, "
              f"drafts accepted {tot['accepted']}/{tot['drafted']}, graph captures "
              f"{tot['graph_captures']} / replays {tot['graph_replays']}, invariants ok, "
              f"{tot['seconds']} s")
    if tot["mismatches"]:
        print(f"demo: {tot['mismatches']} output tokens differ from the cold run", file=sys.stderr)
        return 1
    return 0
