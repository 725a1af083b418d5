"""The spec's ``Sys`` over unbounded sets: objects, requests, disk slots and graphs are
elements of uninterpreted sorts, every record field an array from its sort.

``PSeq`` stands where the spec has a tuple of records.  ``spec.dual.Select``/``Store``
dispatch to it (an array read/write at any element term), so the spec's own guard and
effect functions build the transitions.  Iterating a ``PSeq`` yields the record of a fresh
bound variable: the spec states a fact about every element as ``And(*[phi(x) for x in
seq])``, so ``Scope.fact`` closes such a formula with ``ForAll``.  A ``Count`` over a
``PSeq`` becomes a cardinality term (``Scope.count``): an integer function of the enclosing
bound variables, constrained by axioms true of every finite set (``Scope.card_axioms``,
``Scope.update_axioms``), never by a bound on the size.
"""
import z3

from spec.config import SysConfig
from spec.state import initial

OBJ, REQ, DISK, GRAPH = (z3.DeclareSort(n) for n in ("Obj", "Req", "Disk", "Graph"))
NIL = z3.Const("obj0", OBJ)        # object index 0, as the spec writes into a cleared reference
INDEX_FIELDS = {"req": ("ref",), "disk": ("obj",), "graph": ("ref",)}   # hold OBJ elements
_ONE = SysConfig(n_obj=1, n_req=1, n_disk=1, n_graph=1)                 # record templates


class NotFirstOrder(ValueError):
    """A spec formula the parametric encoding cannot state; ``value`` is the offending term."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value}")
        self.value = value


def consts(e, decls=None):
    """The uninterpreted constants occurring in ``e``, by id (and, into ``decls``, the names
    of every uninterpreted symbol applied)."""
    seen, out, todo = set(), {}, [e]
    while todo:
        t = todo.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if z3.is_app(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            if decls is not None:
                decls.add(t.decl().name())
            if t.num_args() == 0:
                out[t.get_id()] = t
                continue
        todo.extend(t.children())
    return out


def _conjuncts(f):
    if z3.is_and(f):
        return [g for a in f.children() for g in _conjuncts(a)]
    return [f]


def _leaves(rec):
    """(path, value) per leaf of a record; tuple fields give one leaf per position."""
    for f, v in zip(rec._fields, rec):
        if isinstance(v, tuple):
            yield from (((f, j), x) for j, x in enumerate(v))
        else:
            yield (f,), v


class PSeq:
    """A sequence of records of unbounded length: ``arrays`` maps a leaf path to its array."""

    def __init__(self, scope, name, sort, template, arrays):
        self.scope, self.name, self.sort = scope, name, sort
        self.template, self.arrays = template, arrays

    def select(self, i):
        vals = {}
        for f, v in zip(self.template._fields, self.template):
            if isinstance(v, tuple):
                vals[f] = tuple(self.arrays[(f, j)][i] for j in range(len(v)))
            else:
                vals[f] = self.arrays[(f,)][i]
        return type(self.template)(**vals)

    def store(self, i, rec):
        new, changed = dict(self.arrays), False
        for path, v in _leaves(rec):
            if path[0] in INDEX_FIELDS.get(self.name, ()) and isinstance(v, int):
                if v != 0:
                    raise NotFirstOrder("an object index other than 0 written as a number", v)
                v = NIL
            elif isinstance(v, bool):
                raise NotFirstOrder("boolean state leaf", path)
            elif isinstance(v, int):
                v = z3.IntVal(v)
            if not v.eq(self.arrays[path][i]):
                new[path], changed = z3.Store(self.arrays[path], i, v), True
        if changed:
            self.scope.points.append((self.sort, i))
        return PSeq(self.scope, self.name, self.sort, self.template, new)

    def __iter__(self):
        yield self.select(self.scope.mint(self.sort))

    def items(self):
        x = self.scope.mint(self.sort)
        yield x, self.select(x)

    def __getitem__(self, j):
        """Some element: the spec reads only class attributes (``CONTENT``) this way."""
        return self.select(z3.Const(f"any!{self.sort}", self.sort))


class Card:
    """Number of elements x with pred(x, outer...): pred over the canonical ``S!`` arrays."""

    def __init__(self, x, outer, pred, n):
        self.x, self.outer, self.pred, self.n, self.funcs = x, outer, pred, n, {}
        self.reads = None     # leaf paths the predicate reads (filled on first use)

    def func(self, frame):
        if frame not in self.funcs:
            self.funcs[frame] = z3.Function(f"card{self.n}!{frame}",
                                            *[o.sort() for o in self.outer], z3.IntSort())
        return self.funcs[frame]


class Scope:
    """Bound variables minted by iterating a ``PSeq``; the cardinality terms; the state
    frames (P: before a step, Q: after it, I: initial); element points a step stores at."""

    def __init__(self, c):
        self.c, self.minted, self.mint_ix, self.consumed = c, [], {}, set()
        self.cards, self.frames, self.points = {}, {}, []
        self.paths = {}      # leaf path -> (sequence name, sort, range sort) ; canonical S arrays
        self.frame_arrays = {}

    def mint(self, sort):
        x = z3.Const(f"x{len(self.minted)}!{sort}", sort)
        self.mint_ix[x.get_id()] = len(self.minted)
        self.minted.append(x)
        return x

    def state(self, frame):
        """A ``Sys`` of fresh array constants named ``frame!path``."""
        t = initial(_ONE)
        arrays, seqs = {}, {}
        groups = [(("mem", k), OBJ, objs[0]) for k, objs in enumerate(t.mem)]
        groups += [(("disk",), DISK, t.disk[0]), (("req",), REQ, t.req[0]),
                   (("graph",), GRAPH, t.graph[0])]
        for key, sort, rec in groups:
            arr = {}
            for path, _ in _leaves(rec):
                rng = OBJ if path[0] in INDEX_FIELDS.get(key[0], ()) else z3.IntSort()
                full = key + path
                name = "!".join(map(str, full))
                arr[path] = z3.Array(f"{frame}!{name}", sort, rng)
                self.paths[full] = z3.Array(f"S!{name}", sort, rng)
                arrays[full] = arr[path]
            seqs[key] = PSeq(self, key[0], sort, rec, arr)
        miv = z3.Int(f"{frame}!miv")
        self.paths[("miv",)], arrays[("miv",)] = z3.Int("S!miv"), miv
        self.frame_arrays[frame] = arrays
        for a in arrays.values():
            self.frames[a.get_id()] = frame
        return t._replace(mem=tuple(seqs[("mem", k)] for k in range(len(t.mem))),
                          disk=seqs[("disk",)], req=seqs[("req",)], graph=seqs[("graph",)],
                          miv=miv)

    def initial_values(self, frame):
        """Constraints: frame ``frame`` is the spec's initial state at every size."""
        out = []
        for path, a in self.frame_arrays[frame].items():
            if path == ("miv",):
                out.append(a == 0)
                continue
            rng = a.sort().range()
            out.append(a == z3.K(a.sort().domain(), NIL if rng == OBJ else z3.IntVal(0)))
        return out

    def fact(self, fn):
        """``fn()`` closed over the bound variables its element-wise conjunctions minted."""
        start = len(self.minted)
        f = fn()
        f = z3.BoolVal(f) if isinstance(f, bool) else f
        mine = {x.get_id(): x for x in self.minted[start:]}
        out = []
        for part in _conjuncts(f):      # one small quantifier per conjunct: Z3 instantiates
            free = consts(part)         # those far more readily than one over every sequence
            bound = [x for i, x in mine.items() if i in free]
            out.append(z3.ForAll(bound, part) if bound else part)
        return z3.And(*out)

    def open_vars(self, e):
        """Minted variables still free in ``e`` (a guard must have none)."""
        free = consts(e)
        return [x for x in self.minted if x.get_id() in free]

    def count(self, bools):
        """``spec.dual.Count``: a sum of cardinality terms, one per counted sequence."""
        start = len(self.minted)
        items = list(bools)
        mine = {x.get_id(): x for x in self.minted[start:]}
        total = 0
        for b in items:
            if isinstance(b, bool):
                total = total + int(b)
                continue
            free = consts(b)
            xs = [x for i, x in mine.items() if i in free]
            if len(xs) != 1:
                raise NotFirstOrder("a counted item must range over one sequence", b)
            total = total + self._card(xs[0], b, free)
        return total

    def _card(self, x, b, free):
        frames = {self.frames[i] for i in free if i in self.frames}
        if len(frames) != 1:
            raise NotFirstOrder("a count must read exactly one state", b)
        frame = frames.pop()
        outer = sorted((v for i, v in free.items() if i in self.mint_ix and not v.eq(x)),
                       key=lambda v: self.mint_ix[v.get_id()])
        canon_x = z3.Const(f"X!{x.sort()}", x.sort())
        canon_o = [z3.Const(f"O{j}!{o.sort()}", o.sort()) for j, o in enumerate(outer)]
        sub = [(x, canon_x)] + list(zip(outer, canon_o))
        sub += [(a, self.paths[p]) for p, a in self.frame_arrays[frame].items()]
        pred = z3.simplify(z3.substitute(b, *sub))
        key = pred.sexpr()
        if key not in self.cards:
            self.cards[key] = Card(canon_x, canon_o, pred, len(self.cards))
        return self.cards[key].func(frame)(*outer)

    def card_pred(self, card, arrays, x=None):
        """Count ``card``'s predicate on the state ``arrays`` (leaf path -> array), at ``x``."""
        sub = [(self.paths[p], arrays[p]) for p in self.paths]
        if x is not None:
            sub.append((card.x, x))
        return z3.substitute(card.pred, *sub)

    def card_axioms(self, frame):
        """True of every finite set: a count is >= 0, and >= 1 exactly when the set has an
        element."""
        out, arrays = [], self.frame_arrays[frame]
        for card in self.cards.values():
            f = card.func(frame)(*card.outer)
            ax = z3.And(f >= 0, (f >= 1) == z3.Exists([card.x], self.card_pred(card, arrays)))
            out.append(z3.ForAll(card.outer, ax) if card.outer else ax)
        return out

    def deltas(self, arrays, points, pre="P"):
        """A step stores at a few element points; a count over a set that agrees with its
        old self off those points moves by what the points contribute.  Returns {card
        number: delta term} for the counts the step may change (agreement off the points is
        checked per count: ``NotFirstOrder`` when a set changes elsewhere)."""
        out = {}
        for card in self.cards.values():
            d = self._delta(card, self.frame_arrays[pre], arrays, points)
            if d is not None:
                out[card.n] = d
        return out

    def update_axioms(self, deltas, pre="P", post="Q"):
        """Every count after the step is its count before plus its delta."""
        out = []
        for card in self.cards.values():
            eq = (card.func(post)(*card.outer)
                  == card.func(pre)(*card.outer) + deltas.get(card.n, 0))
            out.append(z3.ForAll(card.outer, eq) if card.outer else eq)
        return out

    def _delta(self, card, old, new, points):
        if card.reads is None:
            used = consts(card.pred)
            card.reads = [p for p, s in self.paths.items() if s.get_id() in used]
        read = card.reads
        if all(new[p].eq(old[p]) for p in read):
            return None
        pts = []
        for sort, p in points:
            if sort == card.x.sort() and not any(p.eq(q) for q in pts):
                pts.append(p)
        before, after = self.card_pred(card, old), self.card_pred(card, new)
        sol = z3.Solver()
        sol.add(*[card.x != p for p in pts], before != after)
        if sol.check() != z3.unsat:
            raise NotFirstOrder("a count changes off the stored points", card.pred)
        d = 0
        for j, p in enumerate(pts):
            fresh = z3.And(*[p != q for q in pts[:j]])
            gain = (z3.If(self.card_pred(card, new, p), 1, 0)
                    - z3.If(self.card_pred(card, old, p), 1, 0))
            d = d + z3.If(fresh, gain, 0)
        return d


__all__ = ["DISK", "GRAPH", "NIL", "OBJ", "REQ", "NotFirstOrder", "PSeq", "Scope", "consts"]
