"""`hybridkv fuzz`: end-to-end stateful fuzzing of the engine (hypothesis)."""
import json
import sys

NAME = "fuzz"
HELP = ("random multi-tenant multi-turn conversations, floods, disk spills and faults, version "
        "bumps, drafts and relocations through hk.Engine; every output checked against a cold "
        "recompute, every invariant after every rule")


def add_arguments(parser):
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20, help="rules per example")
    parser.add_argument("--bug", default=None,
                        help="seed an engine bug (the run should then fail): one of "
                             "hybridkv.testing.bugs.BUGS")
    parser.add_argument("--no-shrink", action="store_true",
                        help="stop at the first failure (no shrunk trace; faster)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args):
    import torch
    from tqdm import tqdm

    from hybridkv.testing import fuzz
    from hybridkv.testing.bugs import BUGS

    if args.bug is not None and args.bug not in BUGS:
        raise SystemExit(f"hybridkv fuzz: --bug must be one of {[b for b in BUGS if b]}, "
                         f"not {args.bug!r}")
    torch.set_num_threads(1)
    bar = tqdm(total=args.examples, file=sys.stderr, desc="fuzz", unit="ex")
    r = fuzz.run(args.examples, bug=args.bug, steps=args.steps, tick=lambda: bar.update(1),
                 shrink=not args.no_shrink)
    bar.close()
    out = {"examples": r.examples, "failures": r.failures, "seconds": r.seconds,
           "rules": r.rules, "effects": r.effects}
    if args.bug:
        out["bug"] = args.bug
    if r.failures:
        out["find_seconds"] = r.find_seconds
        out["error"] = r.error
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{r.examples} examples, {r.failures} failures, {r.seconds} s")
        print("examples per rule:   " + ", ".join(f"{k} {v}" for k, v in r.rules.items()))
        print("examples per effect: " + ", ".join(f"{k} {v}" for k, v in r.effects.items()))
    if r.trace:
        print(r.trace, file=sys.stderr)
    return 1 if r.failures else 0
