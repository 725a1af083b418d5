"""`hybridkv demo`: a multi-turn, multi-tenant conversation workload through the engine."""
import json
import sys
import tempfile
import time

NAME = "demo"
HELP = ("run a multi-turn, multi-tenant chat workload through hk.Engine on V4Mini (CPU, local "
        "disk tier in a temp dir; the model reads the cache manager's blocks): per-group hit "
        "lengths, tokens reused vs recomputed, snapshot bytes copied on hits, disk spills / "
        "loads, the fast proof of the spec invariants, and every output checked against a "
        "cold run")


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
    parser.add_argument("--blocks", type=int, default=48, help="blocks per cache pool")
    parser.add_argument("--no-proof", action="store_true", help="skip the invariant proof")


def proof_status():
    """The fast proof of the spec invariants (BMC depth 2 + k-induction on the FAST config,
    no mutation run): {"invariants": {name: result}, "all_proven", "seconds", ...}."""
    from proofs import run as P
    t0 = time.time()
    rows, _ = P.prove_invariants(P.FAST, P.Settings(depth=2, mutation=False))
    return {"config": "FAST", "bmc_depth": 2,
            "invariants": {r["name"]: r["result"] for r in rows},
            "inductive": {r["name"]: r["inductive"] for r in rows},
            "all_proven": all(r["result"] == "proven" for r in rows),
            "seconds": round(time.time() - t0, 3)}


def proof_lines(proof):
    out = [f"proof of the spec invariants ({proof['config']} config, BMC depth "
           f"{proof['bmc_depth']} + k-induction, {proof['seconds']} s):"]
    for name, res in proof["invariants"].items():
        how = "proven by induction" if res == "proven" and proof["inductive"][name] else res
        out.append(f"  {name:<22} {how}")
    return out


def workload(tenants, convs, seed=0):
    """Per tenant a 32-token system prompt (the same tokens for every tenant: only the salt
    keeps them apart) and per conversation a distinct first user message."""
    import random
    rnd = random.Random(seed)
    system = [rnd.randrange(256) for _ in range(32)]
    return [(f"tenant{t}".encode(), [system + [rnd.randrange(256) for _ in range(6)]
                                      for _ in range(convs)]) for t in range(tenants)]


def _turn(eng, model, convs, hist, turn, rows, tot, phase):
    from hybridkv.engine import cold_mismatches
    if turn:
        for i, h in enumerate(hist):
            h += [(7 * turn + 13 * i + k) % 256 for k in range(5)]   # next user message
    outs = eng.generate(hist, tot["_new"], salts=[s for s, _, _ in convs])
    for (salt, c, _), o, h, out in zip(convs, eng.last_outputs, hist, outs):
        bad = cold_mismatches(model, o)
        plan = o.hits[0]
        rows.append({"turn": turn, "phase": phase, "tenant": salt.decode(), "conv": c,
                     "prompt": len(h), "hit": plan.reuse_tokens, "from_disk": o.disk_hits,
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
    eng.cache.check_invariants()


def _disk_stats(engines):
    out = dict.fromkeys(("object_spills", "object_loads_verified", "object_load_failures",
                         "disk_hits"), 0)
    for eng in engines:
        ds = eng.cache.stats()["disk"]
        out["object_spills"] += ds.get("spilled", 0)
        out["object_loads_verified"] += ds.get("load_verified", 0)
        out["object_load_failures"] += ds.get("load_miss", 0)
        out["disk_hits"] += eng.stats()["disk_hits"]
    return out


def run(args):
    """Turns 0 .. turns-1 on one engine; then every cached object is spilled, the process
    "restarts" (a new CacheManager and Engine on the same disk directory, nothing in memory)
    and runs one more turn, which resumes from verified disk loads into pool blocks."""
    import torch

    import hybridkv as hk
    from hybridkv.engine import Engine

    torch.set_num_threads(1)
    t0 = time.time()
    model = hk.V4Mini(seed=args.seed, backend=args.backend)
    rows, tot = [], {"reuse_tokens": 0, "recomputed_tokens": 0, "mismatches": 0,
                     "plan_reuse_tokens": 0, "preemptions": 0, "drafted": 0, "accepted": 0,
                     "_new": args.new_tokens}
    convs = [(salt, c, p) for salt, ps in workload(args.tenants, args.conversations, args.seed)
             for c, p in enumerate(ps)]
    hist = [list(p) for _, _, p in convs]
    engines = []
    with tempfile.TemporaryDirectory(prefix="hybridkv-demo-") as d:
        for phase, turns in (("live", range(args.turns)),
                             ("after restart", range(args.turns, args.turns + 1))):
            disk = hk.DiskTier(d, capacity_bytes=64 << 20)
            cache = hk.CacheManager(model.layout(), num_blocks=args.blocks, disk=disk)
            eng = Engine(model, cache, num_draft_tokens=args.draft_tokens)
            engines.append(eng)
            for turn in turns:
                _turn(eng, model, convs, hist, turn, rows, tot, phase)
            cache.spill_all(30.0)
            disk.close()
    del tot["_new"]
    dstat = _disk_stats(engines)
    copied = [e.cache.stats()["snapshot_bytes_copied"] for e in engines]
    tot.update(requests=len(rows), graph_captures=sum(e.graph.captures for e in engines),
               graph_replays=sum(e.graph.replays for e in engines), invariants="ok",
               snapshot_bytes_restored=sum(c["restored_on_hit"] for c in copied),
               snapshot_bytes_captured=sum(c["captured"] for c in copied),
               replans=sum(e.stats()["replans"] + e.stats()["launch_refused"] for e in engines),
               disk=dstat, workload_seconds=round(time.time() - t0, 3))
    if not args.no_proof:
        tot["proof"] = proof_status()
    tot.update(seconds=round(time.time() - t0, 3), requests_detail=rows)
    if args.json:
        print(json.dumps(tot))
    else:
        print(f"{'turn':>4} {'tenant':<8} {'conv':>4} {'prompt':>6} {'hit':>4} {'outcome':<8} "
              f"{'group hits':<28} {'reused':>6} {'recomp':>6} {'disk':>4} {'bad':>3}")
        for i, r in enumerate(rows):
            if i and r["phase"] != rows[i - 1]["phase"]:
                print(f"-- {r['phase']}: a new CacheManager + Engine on the same disk directory,"
                      " nothing in memory --")
            gh = " ".join(f"{k}={v}" for k, v in r["group_hits"].items())
            print(f"{r['turn']:>4} {r['tenant']:<8} {r['conv']:>4} {r['prompt']:>6} {r['hit']:>4} "
                  f"{r['outcome']:<8} {gh:<28} {r['reused']:>6} {r['recomputed']:>6} "
                  f"{'yes' if r['from_disk'] else '':>4} {r['mismatches']:>3}")
        print(f"\ntokens reused {tot['reuse_tokens']}, recomputed {tot['recomputed_tokens']}, "
              f"mismatches vs cold run {tot['mismatches']}, preemptions {tot['preemptions']}, "
              f"drafts accepted {tot['accepted']}/{tot['drafted']}, graph captures "
              f"{tot['graph_captures']} / replays {tot['graph_replays']}, invariants ok")
        print(f"snapshot bytes copied: {tot['snapshot_bytes_restored']} restored on hits "
              f"(chain blocks read in place), {tot['snapshot_bytes_captured']} captured")
        print(f"disk tier: {dstat['object_spills']} blocks spilled; "
              f"{dstat['object_loads_verified']} loaded (verified) into pool blocks, "
              f"{dstat['object_load_failures']} failed loads; "
              f"{dstat['disk_hits']} requests resumed from disk")
        if "proof" in tot:
            print("\n".join(proof_lines(tot["proof"])))
        print(f"{tot['seconds']} s")
    if tot["mismatches"]:
        print(f"demo: {tot['mismatches']} output tokens differ from the cold run", file=sys.stderr)
        return 1
    return 0 if tot.get("proof", {}).get("all_proven", True) else 1
