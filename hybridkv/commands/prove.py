"""`hybridkv prove`: Z3 proofs of the spec's invariants (BMC + k-induction), vacuity, and
guard mutation; state routing over the block arena (proofs.arena: its rows and guard mutants
beside the system's).  Exit status 1 on any violated/unknown invariant or unreachable action."""
import glob
import json
import os
import sys
import time

NAME = "prove"
HELP = ("prove the spec's invariants with Z3 (BMC + k-induction), check every action is "
        "reachable, and show every guard conjunct matters (mutation)")


def add_arguments(p):
    p.add_argument("--depth", type=int, default=None, help="plain BMC depth (default 4, deep 30)")
    p.add_argument("--objects", type=int, default=None, help="objects per memory kind")
    p.add_argument("--requests", type=int, default=None, help="requests")
    p.add_argument("--deep", action="store_true",
                   help="deep tier: 3 objects per kind, 2 requests, BMC depth 30 (within "
                        "--bmc-budget); mutation still on the fast configuration")
    p.add_argument("--bmc-budget", type=float, default=None,
                   help="seconds plain BMC may take before it stops at the depth reached")
    p.add_argument("--no-mutation", action="store_true", help="skip the mutation run")
    p.add_argument("--mutant", action="append", default=[],
                   help="only this mutant (guard#index); repeatable")
    p.add_argument("--kill-timeout", type=float, default=600.0,
                   help="seconds one full-depth kill search of a mutant may take")
    p.add_argument("--jobs", type=int, default=1, help="processes for the mutation run")
    p.add_argument("--save-traces", default=None,
                   help="directory for counterexample traces (JSON)")
    p.add_argument("--seed-traces", default=None,
                   help="directory of trace files (e.g. tests/golden) whose action lists also "
                        "seed the mutants' kill search (a counterexample found before is "
                        "replayed first)")
    p.add_argument("--parametric", action="store_true",
                   help="parametric tier: every invariant and auxiliary fact for every number "
                        "of objects, requests, disk slots and graphs (the fast configuration's "
                        "constants); then guard mutation on that tier unless --no-mutation")
    p.add_argument("--mutate", action="store_true",
                   help="with --parametric: only the mutation run (each mutant re-checks the "
                        "steps of the actions calling its guard; the baseline proof of the "
                        "other steps is `--parametric --no-mutation`'s)")
    p.add_argument("--fact-timeout", type=float, default=120.0,
                   help="parametric tier: seconds Z3 may take per fact and step")
    p.add_argument("--mutant-budget", type=float, default=600.0,
                   help="parametric mutation: seconds one mutant may take in all")
    p.add_argument("--reach-depth", type=int, default=4,
                   help="parametric tier: depth of the concrete search (from the states of "
                        "--seed-traces, else from the initial state; within --kill-timeout) "
                        "that confirms a fact's finite counterexample to induction is "
                        "reachable at its size")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def _settings(args):
    from proofs.run import DEEP, FAST, Settings
    c = DEEP if args.deep else FAST
    if args.objects is not None:
        c = c._replace(n_obj=args.objects)
    if args.requests is not None:
        c = c._replace(n_req=args.requests)
    depth = args.depth if args.depth is not None else (30 if args.deep else 4)
    budget = args.bmc_budget if args.bmc_budget is not None else (1800.0 if args.deep else 60.0)
    st = Settings(depth=depth, bmc_budget=budget, mutation=not args.no_mutation, sat=args.deep,
                  only=tuple(args.mutant), jobs=max(1, args.jobs),
                  kill_timeout_ms=int(args.kill_timeout * 1000),
                  seed_traces=tuple(sorted(glob.glob(os.path.join(args.seed_traces, "*.json"))))
                  if args.seed_traces else ())
    return c, st


def _table(report):
    lines = [f"{'invariant':<22} {'method':<18} {'depth':>5} {'inductive':>9} "
             f"{'result':<9} {'seconds':>8}"]
    for r in report.invariants:
        lines.append(f"{r['name']:<22} {r['method']:<18} {r['depth']:>5} "
                     f"{str(r['inductive']):>9} {r['result']:<9} {r['seconds']:>8.2f}")
    if report.mutations:
        killed = sum(m.killed for m in report.mutations)
        lines += ["", f"mutants killed {killed}/{len(report.mutations)}"]
        for m in report.mutations:
            what = f"killed by {m.invariant} ({m.how})" if m.killed else f"SURVIVED: {m.how}"
            lines.append(f"  {m.mutant.name:<28} {m.mutant.conjunct[:40]:<40} {what}"
                         f"  {m.seconds:.1f}s")
    lines += ["", "unreachable actions: " + (", ".join(report.unreachable) or "none")]
    return "\n".join(lines)


def _save(report, out):
    from proofs import trace as tr
    os.makedirs(out, exist_ok=True)
    for m in report.mutations:
        if m.trace:
            tr.save(m.trace, os.path.join(out, m.mutant.name.replace("#", "_") + ".json"))
    for n, t in enumerate(report.ctis):
        tr.save(t, os.path.join(out, f"cti_{n}_{t['invariant'].replace(':', '_')}.json"))


def _with_arena(report, st, tick):
    """State routing over the block arena (proofs.arena, BMC to the same depth + 1-induction):
    its rows beside the invariants, its guard mutants beside the system's."""
    from proofs.arena import mutate_arena, prove_arena
    rows, ctis = prove_arena(depth=st.depth, budget_s=st.bmc_budget)
    tick("arena")
    report.invariants.extend(rows)
    report.ctis.extend(ctis)
    if st.mutation:
        report.mutations.extend(mutate_arena(only=st.only))


def _reach(args, facts, tick):
    """Confirm each finite CTI of a fact not proven by the concrete search at its sizes."""
    from proofs import search
    from proofs import trace as tr
    from proofs.cti import reach
    from proofs.parametric import props
    paths = sorted(glob.glob(os.path.join(args.seed_traces, "*.json"))) if args.seed_traces else []
    prefixes = [search.actions_of(tr.load(p)) for p in paths]
    out = {}
    for f in facts:
        if f.cti is not None:
            tick(f"reach {f.name}")
            t, answer, secs = reach(f.cti, args.reach_depth, prefixes,
                                    int(args.kill_timeout * 1000), props())
            out[f.name] = {"answer": answer, "seconds": round(secs, 3), "trace": t}
    return out


def _parametric(args, tick):
    from proofs.mutate import mutants
    from proofs.arena_sizes import mutate_all_sizes, prove_all_sizes
    from proofs.parametric import PEncoding, prove_parametric
    from proofs.pmutate import mutate_parametric
    from proofs.run import FAST
    ms = int(args.fact_timeout * 1000)
    t0 = time.perf_counter()
    enc = PEncoding(FAST)
    built = time.perf_counter() - t0
    facts, reached, muts = [], {}, []
    if not args.mutate:
        facts, _ = prove_parametric(FAST, timeout_ms=ms, tick=tick, enc=enc)
        reached = _reach(args, facts, tick)
    t0 = time.perf_counter()
    if args.mutate or not args.no_mutation:
        todo = [m for m in mutants() if not args.mutant or m.name in args.mutant]
        muts = mutate_parametric(enc, todo, timeout_ms=ms, budget_s=args.mutant_budget,
                                 tick=tick)
    rows = [dict(f.as_json(), **({"reach": reached[f.name]} if f.name in reached else {}))
            for f in facts]
    out = {"parametric": rows, "build_seconds": round(built, 3),
           "mutations": {"killed": sum(m.killed for m in muts), "total": len(muts),
                         "seconds": round(time.perf_counter() - t0, 1),
                         "results": [m.as_json() for m in muts],
                         "survivors": [{"mutant": m.mutant.name, "guard": m.mutant.guard,
                                        "conjunct": m.mutant.conjunct, "reason": m.how}
                                       for m in muts if m.result in ("redundant", "unused")]},
           "config": {k: v for k, v in FAST._asdict().items() if not k.startswith("n_")}}
    arena = []
    if not args.mutate:
        arena, arena_built = prove_all_sizes(timeout_ms=ms)
        out["parametric"] += [f.as_json() for f in arena]
        out["build_seconds"] = round(built + arena_built, 3)
    if args.mutate or not args.no_mutation:
        arena_muts = mutate_all_sizes(timeout_ms=ms, only=tuple(args.mutant))
        out["mutations"]["results"] += arena_muts
        out["mutations"]["killed"] += sum(m["result"] == "killed" for m in arena_muts)
        out["mutations"]["total"] += len(arena_muts)
    ok = (all(f.result == "proven-all-sizes" for f in facts + arena)
          and all(m.result != "undecided" for m in muts))
    return out, ok, muts


def _parametric_table(out, muts):
    from proofs import trace as tr
    lines = []
    if out["parametric"]:
        lines.append(f"{'fact':<22} {'result':<17} {'seconds':>8}  detail")
    for r in out["parametric"]:
        lines.append(f"{r['name']:<22} {r['result']:<17} {r['seconds']:>8.2f}  {r['detail']}")
        if "cti" in r:
            lines += ["", tr.format_trace(r["cti"]["trace"])]
        if "reach" in r:
            t = r["reach"]["trace"]
            lines += ["", tr.format_trace(t) if t else
                      f"not reached within --reach-depth: {r['reach']['answer']}"]
    m = out["mutations"]
    if m["total"]:
        lines += ["", f"parametric mutants killed {m['killed']}/{m['total']} in {m['seconds']}s"]
        lines += ["  " + x.line() for x in muts]
        lines += [f"  {x['mutant']:<28} {x['result']:<9} {x['fact']}  {x['seconds']}s"
                  for x in m["results"][len(muts):]]      # the arena's, after the system's
    return "\n".join(lines)


def run(args):
    from tqdm import tqdm

    from proofs import trace as tr
    from proofs.run import FAST, prove
    c, st = _settings(args)
    bar = tqdm(desc="prove", file=sys.stderr, unit="step", leave=False)

    def tick(msg):
        bar.set_postfix_str(msg[:60])
        bar.update(1)

    try:
        if args.parametric:
            out, ok, muts = _parametric(args, tick)
        else:
            report = prove(c, st, tick, mutation_config=FAST if args.deep else None)
            _with_arena(report, st, tick)
    finally:
        bar.close()
    if args.parametric:
        print(json.dumps(out) if args.json else _parametric_table(out, muts))
        return 0 if ok else 1
    if args.save_traces:
        _save(report, args.save_traces)
    if args.json:
        print(json.dumps(report.as_json()))
    else:
        print(_table(report))
        for t in report.ctis:
            print()
            print(tr.format_trace(t))
    return 0 if report.ok else 1
