"""Spec -> Z3: symbolic whole-system states and the transition relation over bit-vectors.

Nothing here restates a guard.  ``spec.step`` runs unchanged on a ``Sys`` whose every int leaf
is a ``z3.BitVec``; index-like action arguments (object ``i``, positions ``p``/``H``, ``ref``
tuples) become fresh per-step variables constrained to their domain, while the arguments the
spec uses as Python indices (kind ``k``, request ``r``, disk ``d``, graph ``g``, fault ``f``)
stay concrete, one disjunct each.

Encoding of one step (``Encoding.step``): a selector ``sel`` names the action instance; every
state leaf of the next state is an if-chain over the instances that may change it; the step
holds iff the selected instance is enabled and its symbolic arguments lie in their domains.
"""
import inspect
import itertools
from typing import NamedTuple

import z3

from spec import dual
from spec.funnel import DISK_ALIGN
from spec.state import initial
from spec.step import step
from spec.system import ACTIONS

from proofs.flat import bv_to_int, flatten, leaf_paths, unflatten

__all__ = ["ALWAYS_SYMBOLIC", "INIT", "SYMBOLIC_PARAMS", "BadConfig", "Encoding", "FlatEncoding",
           "Instance", "bv_to_int", "flatten", "instances", "leaf_paths", "unflatten", "unroll",
           "width_for"]

# arguments that may be symbolic when the spec only Selects/Stores with them; an action whose
# function rejects a symbolic value (uses it as a Python index) gets them enumerated instead
SYMBOLIC_PARAMS = ("i", "p", "H", "ref", "r", "d", "g")
ALWAYS_SYMBOLIC = ("i", "p", "H", "ref")


class BadConfig(ValueError):
    """A configuration the encoding cannot represent; ``value`` is the offending config."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


def width_for(c, headroom=0):
    """Bit width with every bounded value (doubled, plus ``headroom`` for a mutant's runaway
    counter) inside [0, 2**(w-1)), so the spec's signed ``<`` agrees with Python's.

    DISK_ALIGN is deliberately left out: it is a power of two at least 2**w, so its numeral
    wraps to 0 and ``URem(x, 0) == x``; hence ``Mod(x, DISK_ALIGN) == 0`` is exactly
    ``x == 0`` for the in-range x the encoding admits."""
    if c.ratio < 1 or c.granule < 1 or min(c.n_obj, c.n_req, c.n_disk, c.n_graph) < 1:
        raise BadConfig("sizes and ratios must be >= 1", c)
    bound = max(c.max_pos, c.max_ver, c.max_ep, c.max_iv, c.n_req + c.n_disk, c.n_obj,
                4 * c.n_obj + c.n_disk, c.cap, c.kabi + 1, c.n_faults, 8,
                c.max_pos * c.ratio + c.overlap, c.granule)
    w = (2 * bound + headroom + 1).bit_length() + 1
    if DISK_ALIGN & (DISK_ALIGN - 1) or DISK_ALIGN < 1 << w:
        w = max(w, DISK_ALIGN.bit_length() + 1)
    return w


class Instance(NamedTuple):
    name: str
    args: tuple      # concrete values, or a parameter name (str) for a symbolic argument
    params: tuple    # parameter names, in order


def instances(c, symbolic=SYMBOLIC_PARAMS):
    """Action instances: concrete arguments enumerated, symbolic ones left as names."""
    out = []
    for name, (fn, domains) in ACTIONS.items():
        params = tuple(inspect.signature(fn).parameters)[2:]
        doms = domains(c)
        choices = [[p] if p in symbolic else list(d) for p, d in zip(params, doms)]
        out += [Instance(name, args, params) for args in itertools.product(*choices)]
    return out


def _domain(var, dom):
    dom = list(dom)
    if dom and isinstance(dom[0], tuple):
        comps = [sorted({t[j] for t in dom}) for j in range(len(dom[0]))]
        if set(itertools.product(*comps)) != set(dom):
            raise BadConfig("tuple domain is not a product", dom)
        return z3.And(*[_domain(v, cs) for v, cs in zip(var, comps)])
    lo, hi = min(dom), max(dom)
    if list(dom) == list(range(lo, hi + 1)):
        return z3.And(var >= lo, var <= hi)
    return z3.Or(*[var == x for x in dom])


class FlatEncoding:
    """What an encoding over a flattened bit-vector state shares (the whole system's
    ``Encoding``, ``proofs.arena.ArenaEncoding``): per-step state variables, the initial
    state, the step as a selector over the action instances, predicates built once on the
    template and renamed per step.  A subclass sets ``c``, ``w``, ``stutter``, ``template``,
    ``paths``, ``cur``, ``inst``, ``enabled``, ``changes`` (per leaf: (instance, new value)
    for every instance that may change it), ``sel_w`` and ``_preds``."""

    def state_vars(self, t):
        return [z3.BitVec(f"s{t}!{p}", self.w) for p in self.paths]

    def sym(self, leaves):
        return unflatten(self.template, iter(leaves))

    def init(self, vs):
        return z3.And(*[v == x for v, x in zip(vs, flatten(self.template))])

    def _select(self, t, vs, ws, sub):
        """(constraint, selector ``sel!t``): ``ws`` follows ``vs`` by the instance the selector
        names, ``sub`` renaming the template's variables to this step's; with ``stutter`` the
        value ``len(inst)`` is a no-op."""
        sel = z3.BitVec(f"sel!{t}", self.sel_w)
        n = len(self.inst)
        parts = [z3.ULT(sel, n + 1 if self.stutter else n)]
        en = sel == n if self.stutter else z3.BoolVal(False)
        for j in reversed(range(n)):
            en = z3.If(sel == j, self.enabled[j], en)
        parts.append(z3.substitute(en, *sub))
        for k, ch in enumerate(self.changes):
            val = vs[k]
            for j, x in reversed(ch):
                val = z3.If(sel == j, z3.substitute(x, *sub), val)
            parts.append(ws[k] == val)
        return z3.And(*parts), sel

    def holds(self, pred, vs):
        """``pred(state, config)`` (an invariant) on the state with leaves ``vs``; the
        predicate is built once on the template state (at this encoding's width) and renamed
        per step."""
        if pred not in self._preds:
            dual.set_width(self.w)
            self._preds[pred] = z3.simplify(_bool(pred(self.sym(self.cur), self.c)))
        return z3.substitute(self._preds[pred], *zip(self.cur, vs))


class Encoding(FlatEncoding):
    """The transition relation of configuration ``c`` over template variables, instantiated
    per step by substitution.  Build it while the mutants of interest are applied."""

    def __init__(self, c, headroom=0, simplify=True, stutter=False, symbolic=SYMBOLIC_PARAMS):
        self.c, self.stutter = c, stutter
        self._preds = {}
        self.w = width_for(c, headroom)
        dual.set_width(self.w)
        self.template = initial(c)
        self.paths = leaf_paths(self.template)
        self.cur = [z3.BitVec(f"s!{p}", self.w) for p in self.paths]
        self.argvars = self._argvars("a!")
        s = self.sym(self.cur)
        self.inst, results = [], []
        for ins in instances(c, symbolic):
            try:
                results.append(self._apply(s, ins))
                self.inst.append(ins)
            except (TypeError, IndexError):   # a Python index got a symbolic value
                for ins2 in _concretise(c, ins):
                    results.append(self._apply(s, ins2))
                    self.inst.append(ins2)
        self.sel_w = max(1, len(self.inst).bit_length()) + 1
        nxt, self.enabled = [], []
        for ins, (en, s2) in zip(self.inst, results):
            doms = ACTIONS[ins.name][1](c)
            dom = [_domain(self.argvars[a], d) for a, d in zip(ins.args, doms)
                   if isinstance(a, str)]
            en = z3.And(_bool(en), *dom)
            leaves = [_bv(x, self.w) for x in flatten(s2)]
            if simplify:
                en, leaves = z3.simplify(en), [z3.simplify(x) for x in leaves]
            self.enabled.append(en)
            nxt.append(leaves)
        # per leaf: (instance index, new value) for every instance that may change it
        self.changes = [[(j, nxt[j][n]) for j in range(len(self.inst))
                         if not nxt[j][n].eq(self.cur[n])] for n in range(len(self.paths))]

    def _apply(self, s, ins):
        args = tuple(self.argvars[a] if isinstance(a, str) else a for a in ins.args)
        return step(s, self.c, ins.name, args)

    def _argvars(self, tag):
        out = {}
        for p in SYMBOLIC_PARAMS:
            if p == "ref":
                out[p] = tuple(z3.BitVec(f"{tag}ref{k}", self.w)
                               for k in range(len(self.template.mem)))
            else:
                out[p] = z3.BitVec(f"{tag}{p}", self.w)
        return out

    def step(self, t, vs, ws):
        """Constraint: state ``ws`` follows ``vs`` by one action (selector ``sel!t``; with
        ``stutter``, the value ``len(inst)`` is a no-op, so depth d covers shorter traces)."""
        args = self._argvars(f"a{t}!")
        sub = list(zip(self.cur, vs))
        for p in SYMBOLIC_PARAMS:
            sub += list(zip(_tup(self.argvars[p]), _tup(args[p])))
        constraint, sel = self._select(t, vs, ws, sub)
        return constraint, sel, args

    def enabled_at(self, name, vs):
        """Some instance of action ``name`` is enabled in the state with leaves ``vs`` (its
        symbolic arguments left free, i.e. existentially chosen by the solver)."""
        sub = list(zip(self.cur, vs))
        return z3.Or(*[z3.substitute(en, *sub) for ins, en in zip(self.inst, self.enabled)
                       if ins.name == name])

    def enabled_names(self, model, vs):
        """Action names the model shows enabled in state ``vs`` (with the model's argument
        values; names enabled only for other argument values may be missed)."""
        out = set()
        for name in {ins.name for ins in self.inst}:
            v = model.eval(self.enabled_at(name, vs), model_completion=True)
            if z3.is_true(v):
                out.add(name)
        return out


INIT = "init"


def unroll(enc, depth, sol=None, start=INIT, states=None, steps=None, timeout_ms=0):
    """Add ``depth`` transitions of ``enc`` to the solver ``sol`` (a fresh QF_BV solver when
    None).  A new unrolling starts from the initial state (``start=INIT``), from any state
    (``None``), or from one of the concrete ``start`` states (flat leaf lists); passing the
    ``states``/``steps`` lists of an earlier call extends that unrolling in place.  Returns
    (solver, states: leaf-variable lists, steps: (selector, argument variables) pairs)."""
    if sol is None:
        sol = z3.SolverFor("QF_BV")
        if timeout_ms:
            sol.set("timeout", timeout_ms)
    if states is None:
        states, steps = [enc.state_vars(0)], []
        if isinstance(start, str):
            if start != INIT:
                raise BadConfig("unknown start", start)
            sol.add(enc.init(states[0]))
        elif start is not None:
            sol.add(z3.Or(*[z3.And(*[v == x for v, x in zip(states[0], leaves)])
                            for leaves in start]))
    for _ in range(depth):
        t = len(steps)
        ws = enc.state_vars(t + 1)
        f, sel, args = enc.step(t, states[-1], ws)
        sol.add(f)
        states.append(ws)
        steps.append((sel, args))
    return sol, states, steps


def _concretise(c, ins):
    """``ins`` with every optionally-symbolic argument enumerated over its domain."""
    doms = ACTIONS[ins.name][1](c)
    choices = [list(d) if isinstance(a, str) and a not in ALWAYS_SYMBOLIC else [a]
               for a, d in zip(ins.args, doms)]
    return [ins._replace(args=args) for args in itertools.product(*choices)]


def _tup(x):
    return x if isinstance(x, tuple) else (x,)


def _bool(x):
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _bv(x, w):
    if isinstance(x, bool):
        raise BadConfig("boolean state leaf", x)
    return z3.BitVecVal(x, w) if isinstance(x, int) else x
