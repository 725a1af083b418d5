"""Finite instances of the parametric tier: every uninterpreted sort bounded to at most k
elements, so that a step query Z3 cannot decide for every size becomes a quantifier-free one
whose model is a concrete counterexample to induction (CTI) of a size it names.

``Universe(k)`` holds k element constants per sort.  ``expand`` replaces each ``ForAll`` by
the conjunction of its instances over those elements (``Exists``: the disjunction); every
constant of a bounded sort is one of them; a count is the number of distinct elements its
predicate holds of (the first occurrence of each element counts), so the finite query says
exactly: a state of at most k objects, requests, disk slots and graphs satisfies S, the
action is enabled, and the fact is false after it.  A model is read back as a ``spec`` state
of those sizes (``concrete_state``) and replayed on plain ints (``proofs.cti``).
"""
import itertools

import z3

from spec.state import initial

from proofs.pstate import DISK, GRAPH, NIL, OBJ, REQ, consts

SORTS = (OBJ, REQ, DISK, GRAPH)
SIZE_FIELDS = {OBJ: "n_obj", REQ: "n_req", DISK: "n_disk", GRAPH: "n_graph"}
SEQUENCES = {"mem": OBJ, "disk": DISK, "req": REQ, "graph": GRAPH}


class FiniteMismatch(RuntimeError):
    """The finite instance and the spec disagree on a concrete state (an encoding bug);
    ``value`` names what disagreed."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


class Universe:
    """At most ``k`` elements per sort (``distinct``: exactly ``k``); ``k`` is one bound for
    every sort or a ``{"n_obj": .., "n_req": .., "n_disk": .., "n_graph": ..}`` dict."""

    def __init__(self, k, distinct=False):
        self.k, self.distinct = k, distinct
        size = k if isinstance(k, dict) else {f: k for f in SIZE_FIELDS.values()}
        self.elems = {s: [z3.Const(f"e{j}!{s}", s) for j in range(size[SIZE_FIELDS[s]])]
                      for s in SORTS}

    def expand(self, f, memo=None):
        """``f`` with every quantifier instantiated over the elements."""
        memo = {} if memo is None else memo
        key = f.get_id()      # the memo keeps f alive: a freed term's id may be reused
        if key in memo:
            return memo[key][1]
        if z3.is_quantifier(f):
            sorts = [f.var_sort(j) for j in range(f.num_vars())]
            insts = [self.expand(z3.substitute_vars(f.body(), *reversed(vals)), memo)
                     for vals in itertools.product(*[self.elems[s] for s in sorts])]
            out = z3.And(*insts) if f.is_forall() else z3.Or(*insts)
        elif z3.is_app(f) and f.num_args():
            kids = [self.expand(x, memo) for x in f.children()]
            same = all(a.eq(b) for a, b in zip(kids, f.children()))
            out = f if same else f.decl()(*kids)
        else:
            out = f
        memo[key] = (f, out)
        return out

    def closure(self, fs):
        """Every constant of a bounded sort occurring in ``fs`` is one of the elements (and,
        with ``distinct``, the elements are pairwise different)."""
        seen = {NIL.get_id(): NIL}
        for f in fs:
            seen.update(consts(f))
        out = []
        for c in seen.values():
            es = self.elems.get(c.sort())
            if es is not None and not any(c.eq(e) for e in es):
                out.append(z3.Or(*[c == e for e in es]))
        if self.distinct:
            out += [z3.Distinct(*es) for es in self.elems.values() if len(es) > 1]
        return out

    def references(self, frame_arrays):
        """Every object reference a state holds (``req.ref``, ``disk.obj``, ``graph.ref``) at
        an element is an element."""
        out = []
        for arr in frame_arrays.values():
            if z3.is_array(arr) and arr.sort().range() == OBJ:
                for e in self.elems[arr.sort().domain()]:
                    out.append(z3.Or(*[z3.Select(arr, e) == x for x in self.elems[OBJ]]))
        return out

    def _new(self, sort, j):
        """Element j is not an earlier one (so a count sees each element once)."""
        if self.distinct:
            return z3.BoolVal(True)
        e = self.elems[sort][j]
        return z3.And(*[e != x for x in self.elems[sort][:j]])

    def counts(self, scope, frame, arrays):
        """Each count of frame ``frame`` (its function ``card{n}!frame``) equals the number
        of elements its predicate holds of, on the state ``arrays`` (leaf path -> array)."""
        out = []
        for card in scope.cards.values():
            sort = card.x.sort()
            for outer in itertools.product(*[self.elems[o.sort()] for o in card.outer]):
                pick = list(zip(card.outer, outer))
                terms = []
                for j, e in enumerate(self.elems[sort]):
                    pred = scope.card_pred(card, arrays, e)
                    pred = z3.substitute(pred, *pick) if pick else pred
                    terms.append(z3.If(z3.And(self._new(sort, j), pred), 1, 0))
                out.append(card.func(frame)(*outer) == z3.Sum(terms))
        return out

    def sizes(self, model):
        """Per sort, the number of distinct elements in ``model``."""
        return {SIZE_FIELDS[s]: len(self._classes(model, s)) for s in SORTS}

    def _classes(self, model, sort):
        """Representatives of the distinct elements, in order (object NIL's first: it is the
        spec's object 0, the value a cleared reference holds)."""
        reps = []
        es = self.elems[sort]
        if sort == OBJ:
            es = [next(e for e in es if z3.is_true(model.eval(e == NIL)))] + es
        for e in es:
            if not any(z3.is_true(model.eval(e == r)) for r in reps):
                reps.append(e)
        return reps

    def index(self, model, sort, term):
        """The spec index of element ``term`` in ``model``."""
        for n, r in enumerate(self._classes(model, sort)):
            if z3.is_true(model.eval(term == r, model_completion=True)):
                return n
        raise FiniteMismatch("an element outside the universe", str(term))


def _value(model, uni, arr, elem):
    v = model.eval(z3.Select(arr, elem), model_completion=True)
    return uni.index(model, OBJ, v) if v.sort() == OBJ else v.as_long()


def _record(template, values):
    """``template`` (a record) with leaf values ``values[path]``, path (field,) or
    (field, position)."""
    vals = {}
    for f, v in zip(template._fields, template):
        vals[f] = (tuple(values[(f, j)] for j in range(len(v))) if isinstance(v, tuple)
                   else values[(f,)])
    return type(template)(**vals)


def concrete_state(c, frame_arrays, model, uni):
    """The spec state (and its ``SysConfig``: ``c`` with the model's sizes) that frame
    ``frame_arrays`` (leaf path -> array, as ``Scope.frame_arrays``) holds in ``model``."""
    c2 = c._replace(**uni.sizes(model))
    s = initial(c2)
    groups = {}
    for path, arr in frame_arrays.items():
        if path[0] == "mem":
            groups.setdefault(("mem", path[1]), {})[path[2:]] = arr
        elif path[0] != "miv":
            groups.setdefault((path[0],), {})[path[1:]] = arr

    def seq(key, templates):
        reps = uni._classes(model, SEQUENCES[key[0]])
        return tuple(_record(t, {p: _value(model, uni, a, e) for p, a in groups[key].items()})
                     for t, e in zip(templates, reps))

    mem = tuple(seq(("mem", k), objs) for k, objs in enumerate(s.mem))
    miv = model.eval(frame_arrays[("miv",)], model_completion=True).as_long()
    return c2, s._replace(mem=mem, disk=seq(("disk",), s.disk), req=seq(("req",), s.req),
                          graph=seq(("graph",), s.graph), miv=miv)


def assign(c, s, frame_arrays, uni):
    """Constraints: frame ``frame_arrays`` holds the concrete spec state ``s`` (of
    configuration ``c``) on the elements of ``uni`` (a distinct universe of the state's
    sizes; element i of a sort is index i)."""
    out = [NIL == uni.elems[OBJ][0]]
    for path, arr in frame_arrays.items():
        if path == ("miv",):
            out.append(arr == s.miv)
            continue
        if path[0] == "mem":
            recs, sub = s.mem[path[1]], path[2:]
        else:
            recs, sub = getattr(s, path[0]), path[1:]
        sort = SEQUENCES[path[0]]
        for i, rec in enumerate(recs):
            v = getattr(rec, sub[0])
            v = v[sub[1]] if len(sub) > 1 else v
            v = uni.elems[OBJ][v] if arr.sort().range() == OBJ else z3.IntVal(v)
            out.append(z3.Select(arr, uni.elems[sort][i]) == v)
    return out


class FiniteModel:
    """The finite model that holds the spec state ``s`` (of configuration ``c``) in frame
    ``frame`` of ``scope``: each sort is exactly the state's elements, the arrays hold
    ``s``'s values there and every count is the true count.  ``value(formula)`` is the truth
    of a closed formula over that frame (a fact, a count axiom) with every quantifier
    instantiated over the elements.  Instances depend on the sizes alone: ``memo``, a dict
    kept across the models of one scope, saves them for the next state of the same sizes."""

    def __init__(self, scope, c, s, frame="P", memo=None):
        sizes = {f: getattr(c, f) for f in SIZE_FIELDS.values()}
        self.uni = Universe(sizes, distinct=True)
        key = (frame, tuple(sizes.values()))
        memo = {} if memo is None else memo
        if key not in memo:
            memo[key] = ({}, self.uni.counts(scope, frame, scope.frame_arrays[frame]))
        self.expanded, counts = memo[key]
        self.constraints = assign(c, s, scope.frame_arrays[frame], self.uni) + counts
        sol = z3.Solver()
        sol.add(*self.constraints)
        if sol.check() != z3.sat:
            raise FiniteMismatch("no finite model holds the state", s)
        self.model = sol.model()

    def value(self, formula, decided=False):
        """True or False; ``decided``: also prove that every model of the constraints
        agrees (two solver calls; ``FiniteMismatch`` when they do not)."""
        f = self.uni.expand(formula, self.expanded)
        v = self.model.eval(f, model_completion=True)
        if not (z3.is_true(v) or z3.is_false(v)):
            raise FiniteMismatch("the model does not evaluate the formula", str(v)[:200])
        if decided:
            sol = z3.Solver()
            sol.add(*self.constraints, *self.uni.closure([f]), f if z3.is_false(v) else z3.Not(f))
            if sol.check() != z3.unsat:
                raise FiniteMismatch("the finite model does not decide the formula", str(f)[:200])
        return z3.is_true(v)


__all__ = ["FiniteMismatch", "SORTS", "Universe", "assign", "FiniteModel", "concrete_state"]
