"""The parametric tier (``hybridkv prove --parametric``): every invariant proven for every
number of objects, requests, disk slots and graphs at once.

The state is ``proofs.pstate``'s: one array per record field over an uninterpreted sort, so
no size is fixed.  The transition relation applies ``spec.step`` (the spec's own guards and
effects, unchanged) to the parametric state with each action's element arguments left as
free constants of their sort.  The strengthening S = ``spec.INVARIANTS`` +
``spec.aux_facts.PARAMETRIC_AUX`` is stated per element and closed with ``ForAll``; counts
(admission, pins = holders, one loader) are cardinality terms.  A fact is
``proven-all-sizes`` when Z3 shows it holds in the initial state of every size and that
S and T imply it after the step (unsat of the negation, quantifiers by MBQI and
E-matching).  Otherwise it is ``bounded-only`` (what the FAST and DEEP tiers prove), with
the reason, never rounded up: a CTI (S is not inductive as stated) or Z3 giving up.
"""
import time
from typing import NamedTuple

import z3

from spec import dual
from spec.aux_facts import PARAMETRIC_AUX
from spec.invariants import INVARIANTS
from spec.step import step

from proofs.encode import instances
from proofs.pstate import DISK, GRAPH, OBJ, REQ, NotFirstOrder, Scope, consts

SYMBOLIC = ("i", "p", "H", "ref", "r", "d", "g")   # every element and position argument


def props():
    return {**INVARIANTS, **{f"aux:{n}": p for n, p in PARAMETRIC_AUX.items()}}


def _bool(x):
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _arrays(s):
    out = {("miv",): s.miv if dual.is_sym(s.miv) else z3.IntVal(s.miv)}
    seqs = [(("mem", k), q) for k, q in enumerate(s.mem)]
    seqs += [(("disk",), s.disk), (("req",), s.req), (("graph",), s.graph)]
    for key, q in seqs:
        out.update({key + p: a for p, a in q.arrays.items()})
    return out


class PEncoding:
    """Frames P (before a step), Q (after it) and I (initial) of configuration ``c`` (its
    constants: positions, counters, the cap; its sizes are ignored), one step P -> Q per
    action instance, and every fact of ``props()`` closed in each frame.  Build it while
    the mutants of interest are applied."""

    def __init__(self, c):
        self.c, self.scope = c, Scope(c)
        sc = self.scope
        dual.set_width(None)
        dual.set_counter(sc.count)
        try:
            self._build(c, sc)
        finally:
            dual.set_counter(None)

    def _build(self, c, sc):
        pre, post, init = sc.state("P"), sc.state("Q"), sc.state("I")
        args = dict(i=z3.Const("a!i", OBJ), r=z3.Const("a!r", REQ), d=z3.Const("a!d", DISK),
                    g=z3.Const("a!g", GRAPH), p=z3.Int("a!p"), H=z3.Int("a!H"),
                    ref=tuple(z3.Const(f"a!ref{k}", OBJ) for k in range(len(pre.mem))))
        self.args, self.inst, self.steps = args, [], []
        for ins in instances(c, SYMBOLIC):
            sc.points = []
            en, s2 = step(pre, c, ins.name, tuple(args[a] if isinstance(a, str) else a
                                                  for a in ins.args))
            en, arrays = _bool(en), _arrays(s2)
            if sc.open_vars(z3.And(en, *[a == a for a in arrays.values()])):
                raise NotFirstOrder("a guard quantifies over a sequence", ins.name)
            self.inst.append(ins)
            self.steps.append((en, arrays, list(sc.points)))
        self.facts, self.reads = {}, {}
        for frame, s in (("P", pre), ("Q", post), ("I", init)):
            self.facts[frame] = {n: sc.fact(lambda p=p, s=s: p(s, c)) for n, p in props().items()}
        for n, f in self.facts["Q"].items():
            self.reads[n] = []     # per closed conjunct: (formula, names of what it reads)
            for part in (f.children() if z3.is_and(f) else [f]):
                names = set()
                consts(part, names)
                self.reads[n].append((part, names))
        self.axioms = {f: sc.card_axioms(f) for f in ("P", "Q", "I")}
        self.deltas = [sc.deltas(arrays, points) for _, arrays, points in self.steps]
        self.initial = sc.initial_values("I")
        old, new = sc.frame_arrays["P"], sc.frame_arrays["Q"]
        self.changed = [{str(new[p]) for p in new if not arrays[p].eq(old[p])}
                        | {f"card{n}!Q" for n in d}
                        for (_, arrays, _), d in zip(self.steps, self.deltas)]

    def base(self, name, timeout_ms=0):
        """Z3's verdict on: some initial state (any size) violates fact ``name``."""
        return check(self.initial + self.axioms["I"] + [z3.Not(self.facts["I"][name])],
                      timeout_ms)

    def step_query(self, name, a, lean=False):
        """The formulas whose unsat is: S and action instance ``a`` imply ``name`` after it;
        None when the action writes nothing the fact reads (it holds after as before).
        ``lean`` leaves out what is known of the counts the fact does not read (fewer
        quantifiers: often faster, sometimes too weak)."""
        # a conjunct that reads nothing the step writes is its own assumed pre-state twin
        parts = [f for f, names in self.reads[name] if names & self.changed[a]]
        if not parts:
            return None
        en, arrays, _ = self.steps[a]
        new = self.scope.frame_arrays["Q"]
        sub = [(new[p], arrays[p]) for p in new]
        moved = self.deltas[a]
        cards = list(self.scope.cards.values())
        # a count the step leaves alone is the same function after it
        same = [(k.func("Q"), k.func("P")(*[z3.Var(j, o.sort()) for j, o in enumerate(k.outer)]))
                for k in cards if k.n not in moved]
        post = z3.substitute(z3.And(*parts), *sub)
        post = z3.substitute_funs(post, *same) if same else post
        used = set()
        consts(post, used)     # facts about counts the post-state fact never reads are left out
        need = [k.n in moved and (not lean or k.func("Q").name() in used) for k in cards]
        ax = [z3.substitute(f, *sub) for n, f in zip(need, self.axioms["Q"]) if n]
        upd = [f for n, f in zip(need, self.scope.update_axioms(moved)) if n]
        dom = [z3.And(x >= 1, x <= self.c.max_pos) for x in (self.args["p"], self.args["H"])]
        return (list(self.facts["P"].values()) + self.axioms["P"] + ax + upd + dom
                + [en, z3.Not(post)])

    def induction(self, name, timeout_ms=0):
        """Z3's verdict on: S and one step of some action reach a state violating ``name``
        (sat, unknown or unsat, and the action of the first that is not unsat)."""
        for a in range(len(self.inst)):
            full = self.step_query(name, a)
            if full is None:
                continue
            # sat is trusted only from the full query (the lean one drops true assumptions)
            r = check(full, 5_000, mbqi=False)
            r = r if r == z3.unsat else check(full, min(timeout_ms or 15_000, 15_000))
            if r != z3.unsat:
                lean = self.step_query(name, a, lean=True)
                r2 = check(lean, 5_000, mbqi=False)
                r2 = r2 if r2 == z3.unsat else check(lean, timeout_ms)
                r = r2 if r2 == z3.unsat or r != z3.sat else r
            if r != z3.unsat:
                return r, self.inst[a].name
        return z3.unsat, None


def _solver(timeout_ms):
    sol = z3.Solver()
    if timeout_ms:
        sol.set("timeout", timeout_ms)
    return sol


def check(fs, timeout_ms, mbqi=True):
    """One attempt; ``mbqi=False``: E-matching alone (fast on most steps, never sat)."""
    sol = _solver(timeout_ms)
    if not mbqi:
        sol.set("smt.mbqi", False)
    sol.add(*fs)
    r = sol.check()
    return r if mbqi or r == z3.unsat else z3.unknown


class FactResult(NamedTuple):
    name: str
    result: str        # proven-all-sizes | bounded-only (proven by the FAST/DEEP tiers alone)
    seconds: float
    detail: str        # why not for all sizes: a CTI (sat) or Z3 giving up, and where

    def as_json(self):
        return {"name": self.name, "result": self.result, "seconds": round(self.seconds, 3),
                "detail": self.detail}


def prove_fact(enc, name, timeout_ms=120_000):
    t0 = time.perf_counter()
    b = enc.base(name, timeout_ms)
    if b != z3.unsat:
        return FactResult(name, "bounded-only", time.perf_counter() - t0,
                          f"{'cti' if b == z3.sat else 'unknown'} in the initial state")
    r, act = enc.induction(name, timeout_ms)
    if r == z3.unsat:
        return FactResult(name, "proven-all-sizes", time.perf_counter() - t0, "")
    return FactResult(name, "bounded-only", time.perf_counter() - t0,
                      f"{'cti' if r == z3.sat else 'unknown'} after {act}")


def prove_parametric(c, names=None, timeout_ms=120_000, tick=lambda *_: None,
                     stop_at_first=False):
    """Every fact (or those in ``names``): list of FactResult, plus the build seconds."""
    t0 = time.perf_counter()
    enc = PEncoding(c)
    built = time.perf_counter() - t0
    out = []
    for n in names or list(props()):
        out.append(prove_fact(enc, n, timeout_ms))
        tick(f"parametric {n}: {out[-1].result}")
        if stop_at_first and out[-1].result != "proven-all-sizes":
            break
    missing = [r.name for r in out if r.result != "proven-all-sizes"]
    if missing and names is None:
        # every step query assumes all of S: a fact is proven only when all of S is
        out = [r._replace(result="bounded-only",
                          detail=f"inductive relative to S, but not proven: {', '.join(missing)}")
               if r.result == "proven-all-sizes" else r for r in out]
    return out, built


def mutate_parametric(c, todo, baseline, timeout_ms=60_000, tick=lambda *_: None):
    """Each guard mutant on the parametric tier: ``killed`` when some fact is no longer
    proven for all sizes (a CTI, or Z3 giving up where the unmutated proof succeeds),
    ``redundant`` when every fact stays proven (the conjunct provably does not matter at any
    size), ``unused`` when the model never calls the guard.  Only the ``baseline`` facts
    (those the unmutated spec proves at this timeout) are checked.  Returns dicts."""
    from proofs.mutate import applied, guards_called
    used = guards_called(lambda: PEncoding(c))
    out = []
    for m in todo:
        t0 = time.perf_counter()
        if m.guard not in used:
            out.append(dict(mutant=m.name, result="unused", fact="", seconds=0.0))
            continue
        with applied(m):
            res, _ = prove_parametric(c, names=baseline, timeout_ms=timeout_ms,
                                      stop_at_first=True)
        bad = [r for r in res if r.result != "proven-all-sizes"]
        out.append(dict(mutant=m.name, result="killed" if bad else "redundant",
                        fact=f"{bad[0].name} ({bad[0].result} {bad[0].detail})" if bad else "",
                        seconds=round(time.perf_counter() - t0, 1)))
        tick(f"mutant {m.name}: {out[-1]['result']}")
    return out
