"""`hybridkv replay-trace`: re-run a counterexample trace (JSON from `hybridkv prove`)
through the spec's `step`, under the mutant the trace names, and say whether it reproduces."""
import json

NAME = "replay-trace"
HELP = "replay a JSON counterexample trace through spec.step (under its mutant) and check it"


def add_arguments(p):
    p.add_argument("paths", nargs="+", help="trace files")
    p.add_argument("--no-mutant", action="store_true",
                   help="replay without the trace's mutant (expect no violation)")
    p.add_argument("--quiet", action="store_true", help="do not print the traces")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def replay_file(path, with_mutant=True):
    """(trace, Replay) of one file; the trace's mutant is applied unless told otherwise."""
    from proofs import trace as tr
    from proofs.mutate import Mutant, applied
    t = tr.load(path)
    m = Mutant(**t["mutant"]) if (t.get("mutant") and with_mutant) else None
    with applied(m):
        return t, tr.replay(t)


def run(args):
    from proofs import trace as tr
    out, ok = [], True
    for path in args.paths:
        t, r = replay_file(path, not args.no_mutant)
        good = r.reproduced if not args.no_mutant else (t["invariant"] not in r.violated
                                                        or not r.all_enabled)
        ok &= good
        out.append({"path": path, "invariant": t["invariant"], "reproduced": r.reproduced,
                    "all_enabled": r.all_enabled, "violated": r.violated, "ok": good})
        if not args.json and not args.quiet:
            print(tr.format_trace(t))
            print(f"  replay: {'reproduced' if r.reproduced else 'NOT reproduced'}"
                  f" (violated: {', '.join(r.violated) or 'none'})\n")
    if args.json:
        print(json.dumps({"traces": out, "ok": ok}))
    return 0 if ok else 1
