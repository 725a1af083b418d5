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
the reason, never rounded up: a CTI (S is not inductive as stated) or Z3 giving up.  A step
that is not proven is then searched for a finite CTI (``proofs.cti``: every sort bounded to
a few elements), replayed on plain ints; its sizes say how large a pool the failure needs.
Guard mutation on this tier is ``proofs.pmutate``.
"""
import copy
import time
from typing import NamedTuple

import z3

from spec import dual
from spec.aux_facts import PARAMETRIC_AUX
from spec.invariants import INVARIANTS
from spec.step import step

from proofs.cti import find_cti
from proofs.encode import instances
from proofs.mutate import guards_called
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


class StepQuery(NamedTuple):
    """``facts and counts and dom and enabled and goal`` unsat: the step preserves the fact."""
    facts: list      # S in the pre-state (every fact, closed with ForAll)
    counts: list     # what is known of the counts: every count before, the moved ones after
    dom: list        # the position arguments in their range
    enabled: object  # the action instance's guard (spec.step's enabled)
    goal: object     # the fact is false after the step

    def formulas(self):
        return self.facts + self.counts + self.dom + [self.enabled, self.goal]


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
        self.pre, self.args = pre, args
        self.inst = instances(c, SYMBOLIC)
        self.steps = [self._step(ins) for ins in self.inst]   # (enabled, arrays, points)
        self.facts, self.reads, self._guards = {}, {}, {}
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
        self.changed = [self._changed(a) for a in range(len(self.inst))]

    def _step(self, ins):
        """(enabled, post-state arrays, element points stored at) of one action instance,
        by ``spec.step`` with the guards in force now."""
        sc = self.scope
        sc.points = []
        en, s2 = step(self.pre, self.c, ins.name, tuple(self.args[a] if isinstance(a, str)
                                                        else a for a in ins.args))
        en, arrays = _bool(en), _arrays(s2)
        if sc.open_vars(z3.And(en, *[a == a for a in arrays.values()])):
            raise NotFirstOrder("a guard quantifies over a sequence", ins.name)
        return en, arrays, list(sc.points)

    def _changed(self, a):
        """Names of the post-state arrays and counts instance ``a`` may write."""
        old, new = self.scope.frame_arrays["P"], self.scope.frame_arrays["Q"]
        arrays = self.steps[a][1]
        return ({str(new[p]) for p in new if not arrays[p].eq(old[p])}
                | {f"card{n}!Q" for n in self.deltas[a]})

    def variant(self, actions):
        """A copy whose steps of the instance numbers ``actions`` are rebuilt with the
        guards in force now (a guard mutant applied); the other steps, the facts and the
        counts are this encoding's.  Cheap: only those instances run ``spec.step``."""
        out = copy.copy(self)
        out.steps, out.deltas, out.changed = list(self.steps), list(self.deltas), list(self.changed)
        sc = self.scope
        n_cards = len(sc.cards)
        dual.set_width(None)
        dual.set_counter(sc.count)
        try:
            for a in actions:
                out.steps[a] = out._step(self.inst[a])
        finally:
            dual.set_counter(None)
        if len(sc.cards) != n_cards:     # a mutant counted something new: every count again
            out.axioms = {f: sc.card_axioms(f) for f in ("P", "Q", "I")}
            out.deltas = [sc.deltas(arrays, points) for _, arrays, points in out.steps]
            out.changed = [out._changed(a) for a in range(len(out.inst))]
        else:
            for a in actions:
                _, arrays, points = out.steps[a]
                out.deltas[a] = sc.deltas(arrays, points)
                out.changed[a] = out._changed(a)
        return out

    def calls(self, a):
        """Names of the spec guards (keys of spec.GUARDS) instance ``a``'s step calls, and
        those the facts call (a mutant of such a guard would change a fact): found once per
        instance by running its step again under a profiler."""
        if a not in self._guards:
            sc = self.scope
            dual.set_width(None)
            dual.set_counter(sc.count)
            try:
                if "facts" not in self._guards:
                    self._guards["facts"] = guards_called(
                        lambda: [p(self.pre, self.c) for p in props().values()])
                self._guards[a] = guards_called(lambda: self._step(self.inst[a]))
            finally:
                dual.set_counter(None)
        return self._guards[a] | self._guards["facts"]

    def users(self, guard, among=None):
        """Instance numbers (of ``among``, default all) whose step calls spec guard
        ``guard``: the steps a mutant of it changes."""
        return [a for a in (range(len(self.inst)) if among is None else among)
                if guard in self.calls(a)]

    def base(self, name, timeout_ms=0):
        """Z3's verdict on: some initial state (any size) violates fact ``name``."""
        return check(self.initial + self.axioms["I"] + [z3.Not(self.facts["I"][name])],
                      timeout_ms)

    def step_parts(self, name, a, lean=False):
        """The induction step of fact ``name`` over action instance ``a`` as a
        ``StepQuery``; None when the action writes nothing the fact reads (it holds after
        as before).  ``lean`` leaves out what is known of the counts the fact does not
        read (fewer quantifiers: often faster, sometimes too weak)."""
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
        return StepQuery(list(self.facts["P"].values()), self.axioms["P"] + ax + upd, dom, en,
                         z3.Not(post))

    def step_query(self, name, a, lean=False):
        """The formulas whose unsat is: S and action instance ``a`` imply ``name`` after it
        (``step_parts`` as one list); None when the action cannot change the fact."""
        q = self.step_parts(name, a, lean)
        return None if q is None else q.formulas()

    def prove_step(self, name, a, timeout_ms=0):
        """Z3's verdict on: S and one step of instance ``a`` reach a state violating
        ``name`` (unsat: the step is proven; sat: a CTI, maybe infinite; unknown: Z3 gave
        up); None when the step cannot change the fact."""
        full = self.step_query(name, a)
        if full is None:
            return None
        # sat is trusted only from the full query (the lean one drops true assumptions)
        r = check(full, 5_000, mbqi=False)
        r = r if r == z3.unsat else check(full, min(timeout_ms or 15_000, 15_000))
        if r != z3.unsat:
            lean = self.step_query(name, a, lean=True)
            r2 = check(lean, 5_000, mbqi=False)
            r2 = r2 if r2 == z3.unsat else check(lean, timeout_ms)
            r = r2 if r2 == z3.unsat or r != z3.sat else r
        return r

    def induction(self, name, timeout_ms=0):
        """(verdict, instance number) of the first step of ``name`` that is not proven, or
        (unsat, None) when every step is."""
        for a in range(len(self.inst)):
            r = self.prove_step(name, a, timeout_ms)
            if r is not None and r != z3.unsat:
                return r, a
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
    cti: object = None  # proofs.cti.Cti: a finite CTI of the step that is not proven

    def as_json(self):
        out = {"name": self.name, "result": self.result, "seconds": round(self.seconds, 3),
               "detail": self.detail}
        if self.cti is not None:
            out["cti"] = self.cti.as_json()
        return out


def prove_fact(enc, name, timeout_ms=120_000, kmax=3):
    """Fact ``name`` for every size, or ``bounded-only`` with the reason; a step that is
    not proven is searched for a finite CTI with at most ``kmax`` elements per sort."""
    t0 = time.perf_counter()
    b = enc.base(name, timeout_ms)
    if b != z3.unsat:
        return FactResult(name, "bounded-only", time.perf_counter() - t0,
                          f"{'cti' if b == z3.sat else 'unknown'} in the initial state")
    r, a = enc.induction(name, timeout_ms)
    if r == z3.unsat:
        return FactResult(name, "proven-all-sizes", time.perf_counter() - t0, "")
    act = enc.inst[a].name
    cti = find_cti(enc, [name], a, props(), kmax, timeout_ms)
    detail = (f"cti after {act} at {size_text(cti.sizes)}" if cti else
              f"{'cti (no finite one' if r == z3.sat else 'unknown (no cti'} with at most "
              f"{kmax} per sort) after {act}")
    return FactResult(name, "bounded-only", time.perf_counter() - t0, detail, cti)


def size_text(sizes):
    """``{"n_obj": 1, ...}`` as ``1 obj/kind, 2 req, 2 disk, 1 graph``."""
    return (f"{sizes['n_obj']} obj/kind, {sizes['n_req']} req, {sizes['n_disk']} disk, "
            f"{sizes['n_graph']} graph")


def prove_parametric(c, names=None, timeout_ms=120_000, tick=lambda *_: None,
                     stop_at_first=False, enc=None):
    """Every fact (or those in ``names``): list of FactResult, plus the build seconds
    (``enc``: an encoding already built, 0 build seconds)."""
    t0 = time.perf_counter()
    enc = enc or PEncoding(c)
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
