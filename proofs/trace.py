"""Readable counterexample traces: extraction from a Z3 model, JSON, printing, replay.

A trace is a plain dict (JSON-ready):
``{"config": {...}, "mutant": null | {"guard", "index", "conjunct"}, "kind": "bmc" | "cti",
  "invariant": name, "start": null | {leaf path: value}, "steps": [{"action", "args",
  "changes": {leaf path: [old, new]}}], "violated_at": step index}``.
``start`` is null for a trace from the initial state; a counterexample to induction starts
from the arbitrary state it found.  ``replay`` re-runs a trace through ``spec.step`` on
plain ints and reports whether every step was enabled and the invariant really broke.
"""
import json
from typing import NamedTuple

from spec.config import SysConfig
from spec.invariants import INVARIANTS
from spec.state import initial
from spec.step import step

from proofs.encode import bv_to_int, flatten, leaf_paths, unflatten


class TraceError(ValueError):
    """A trace file that does not fit the spec (unknown action, bad config...)."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


class Replay(NamedTuple):
    all_enabled: bool        # every step's action was enabled where it was taken
    first_disabled: int      # index of the first disabled step, -1 if none
    violated: list           # invariant names false in the final state
    reproduced: bool         # all enabled and the trace's invariant is false at the end


def _val(model, v, w):
    return bv_to_int(model.eval(v, model_completion=True), w)


def _json_arg(x):
    return list(x) if isinstance(x, tuple) else x


def extract(enc, model, states, steps, invariant, kind="bmc", mutant=None, aux=None):
    """Trace dict from a model of an unrolling.  ``states`` are the leaf-variable lists,
    ``steps`` the (selector, argument variables) of each transition."""
    vals = [[_val(model, v, enc.w) for v in vs] for vs in states]
    out_steps = []
    for t, (sel, argv) in enumerate(steps):
        j = model.eval(sel, model_completion=True).as_long()
        if j >= len(enc.inst):    # a stutter (no-op) step
            continue
        ins = enc.inst[j]
        args = []
        for a in ins.args:
            if isinstance(a, str):
                v = argv[a]
                args.append(tuple(_val(model, x, enc.w) for x in v) if isinstance(v, tuple)
                            else _val(model, v, enc.w))
            else:
                args.append(a)
        changes = {p: [x, y] for p, x, y in zip(enc.paths, vals[t], vals[t + 1]) if x != y}
        out_steps.append({"action": ins.name, "args": [_json_arg(a) for a in args],
                          "changes": changes})
    start = None
    if kind != "bmc":
        start = dict(zip(enc.paths, vals[0]))
    return {"config": enc.c._asdict(), "mutant": mutant, "kind": kind, "invariant": invariant,
            "start": start, "steps": out_steps, "violated_at": len(out_steps), "aux": aux}


def _start_state(trace, c):
    init = initial(c)
    if trace.get("start") is None:
        return init
    paths = leaf_paths(init)
    missing = [p for p in paths if p not in trace["start"]]
    if missing:
        raise TraceError("start state lacks leaves", missing[:3])
    return unflatten(init, iter(trace["start"][p] for p in paths))


def _args(step_rec):
    return tuple(tuple(a) if isinstance(a, list) else a for a in step_rec["args"])


def replay(trace, invariants=None):
    """Run ``trace`` through ``spec.step`` on ints (with whatever mutant is applied now)."""
    invariants = invariants or INVARIANTS
    c = config_of(trace)
    s = _start_state(trace, c)
    first_disabled = -1
    for n, rec in enumerate(trace["steps"]):
        en, s2 = step(s, c, rec["action"], _args(rec))
        if not en and first_disabled < 0:
            first_disabled = n
        s = s2
    violated = [name for name, inv in invariants.items() if not inv(s, c)]
    ok = first_disabled < 0
    return Replay(ok, first_disabled, violated, ok and trace["invariant"] in violated)


def config_of(trace):
    try:
        return SysConfig(**trace["config"])
    except TypeError as e:
        raise TraceError("config does not match SysConfig", trace.get("config")) from e


def states_of(trace):
    """Concrete states along the trace (start included), as flat leaf lists."""
    c = config_of(trace)
    s = _start_state(trace, c)
    out = [flatten(s)]
    for rec in trace["steps"]:
        s = step(s, c, rec["action"], _args(rec))[1]
        out.append(flatten(s))
    return out


def fmt_args(args):
    return ", ".join(str(tuple(a)) if isinstance(a, list) else str(a) for a in args)


def format_trace(trace):
    """Human-readable, one line per step plus its changed fields."""
    mut = trace.get("mutant")
    head = f"{trace['kind'].upper()} counterexample: invariant {trace['invariant']} breaks"
    if mut:
        head += f" under mutant {mut['guard']}#{mut['index']} ({mut['conjunct']} := True)"
    lines = [head]
    if trace.get("start") is not None:
        lines.append("  start (arbitrary state satisfying the hypothesis):")
        lines += [f"      {p} = {v}" for p, v in trace["start"].items() if v != 0]
    else:
        lines.append("  start: initial state")
    for n, rec in enumerate(trace["steps"], 1):
        lines.append(f"  {n:2d}. {rec['action']}({fmt_args(rec['args'])})")
        for p, (a, b) in rec["changes"].items():
            lines.append(f"        {p}: {a} -> {b}")
    lines.append(f"  => {trace['invariant']} is false after step {trace['violated_at']}")
    return "\n".join(lines)


def save(trace, path):
    with open(path, "w") as f:
        json.dump(trace, f, indent=1, sort_keys=True)


def load(path):
    with open(path) as f:
        trace = json.load(f)
    for key in ("config", "kind", "invariant", "steps"):
        if key not in trace:
            raise TraceError("trace lacks a field", key)
    return trace
