"""Dual-mode helpers: plain Python values on concrete input, Z3 terms on symbolic input.

Guards, invariants and ``step`` are written once with these helpers.  The runtime calls
them on ints and bools; the prover calls the very same functions on Z3 bit-vectors.
Python's ``and``/``or``/``not``/``if`` and chained comparisons silently misbehave on
Z3 terms, so spec code uses only these (a lint test enforces it).

Array mode: on numpy columns (one value per block of a run) the same functions compute
elementwise (``And`` is ``logical_and``, ``If`` is ``where``), so the runtime can evaluate a
guard or an effect once over a run of blocks (``hybridkv.cache.runs``).

Bit-vector values are treated as non-negative and below 2**(width-1): the prover picks
widths so that every bounded counter fits, so signed comparisons (``<`` on a
``BitVecRef``) agree with Python's.
"""
from functools import reduce
import operator

import numpy as np
import z3

_WIDTH = [None]  # bit-vector width used for numerals built from two concrete branches
_COUNTER = [None]  # the parametric prover's Count over unbounded sequences (None: plain sums)


def set_width(width):
    """Select the sort of numerals minted by ``If``/``Count`` (None: Int, n: BitVec(n))."""
    _WIDTH[0] = width


_EXPR = z3.ExprRef
_SPECIAL = (z3.ExprRef, np.ndarray)   # a Z3 term or a numpy column: not a plain value


def is_sym(*xs):
    for x in xs:
        if isinstance(x, _EXPR):
            return True
    return False


def _num(x):
    if isinstance(x, z3.ExprRef) or isinstance(x, bool):
        return x
    return z3.IntVal(x) if _WIDTH[0] is None else z3.BitVecVal(x, _WIDTH[0])


_FAST = frozenset((bool, int))     # plain for sure: no isinstance test needed


def is_plain(*xs):
    """Every value is a plain Python one (neither a Z3 term nor a numpy column)."""
    for x in xs:
        if type(x) not in _FAST and isinstance(x, _SPECIAL):
            return False
    return True


def And(*xs):
    for x in xs:                        # is_plain, inlined: guards call And on the hot path
        if type(x) not in _FAST and isinstance(x, _SPECIAL):
            break
    else:
        return all(xs)
    return z3.And(*xs) if is_sym(*xs) else reduce(np.logical_and, xs)


def Or(*xs):
    for x in xs:
        if type(x) not in _FAST and isinstance(x, _SPECIAL):
            break
    else:
        return any(xs)
    return z3.Or(*xs) if is_sym(*xs) else reduce(np.logical_or, xs)


def Not(x):
    if type(x) in _FAST or not isinstance(x, _SPECIAL):
        return not x
    return z3.Not(x) if is_sym(x) else np.logical_not(x)


def Implies(a, b):
    if is_plain(a, b):
        return (not a) or bool(b)
    return z3.Implies(a, b) if is_sym(a, b) else np.logical_or(np.logical_not(a), b)


def If(c, a, b):
    if type(c) in _FAST or not isinstance(c, _SPECIAL):
        return a if c else b
    return z3.If(c, _num(a), _num(b)) if is_sym(c) else np.where(c, a, b)


def Eq(a, b):
    """Equality that also compares tuples field by field."""
    if isinstance(a, tuple):
        return And(*[Eq(x, y) for x, y in zip(a, b, strict=True)])
    return a == b


def Sum(xs):
    xs = list(xs)
    return reduce(operator.add, xs) if xs else 0


def set_counter(fn):
    """Install how ``Count`` counts (None: a plain sum).  The parametric prover installs one
    that turns a count over an unbounded sequence into a cardinality term."""
    _COUNTER[0] = fn


def Count(bools):
    if _COUNTER[0] is not None:
        return _COUNTER[0](bools)
    return Sum(If(b, 1, 0) for b in bools)


def Min(a, b):
    return If(a <= b, a, b)


def Max(a, b):
    return If(a >= b, a, b)


def _bv_pair(a, b):
    """Both operands as bit-vectors of one width (a numeral adopts the other's width)."""
    w = a.size() if isinstance(a, z3.BitVecRef) else b.size()
    return (a if is_sym(a) else z3.BitVecVal(a, w)), (b if is_sym(b) else z3.BitVecVal(b, w))


def Div(a, b):
    """Floor division of non-negative values."""
    if type(a) is int and type(b) is int:      # the runtime's case, without is_sym's loop
        return a // b
    if not is_sym(a, b):
        return a // b
    if isinstance(a, z3.BitVecRef) or isinstance(b, z3.BitVecRef):
        return z3.UDiv(*_bv_pair(a, b))
    return a / b


def Mod(a, b):
    """Remainder of non-negative values."""
    if type(a) is int and type(b) is int:
        return a % b
    if not is_sym(a, b):
        return a % b
    if isinstance(a, z3.BitVecRef) or isinstance(b, z3.BitVecRef):
        return z3.URem(*_bv_pair(a, b))
    return a % b


def concrete(x):
    """Evaluate a closed Z3 term back to a Python int/bool; plain values pass through."""
    if not is_sym(x):
        return x
    v = z3.simplify(x)
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    return v.as_long()


def Ite(c, a, b):
    """``If`` that also works field-wise on (named) tuples of equal shape."""
    if isinstance(a, tuple):
        vals = [Ite(c, x, y) for x, y in zip(a, b, strict=True)]
        return type(a)(*vals) if hasattr(a, "_fields") else tuple(vals)
    return If(c, a, b)


def Items(seq):
    """``enumerate(seq)``: (index, element) pairs; a sequence of unbounded length (the
    parametric prover's) yields one element at a quantified index instead."""
    return seq.items() if hasattr(seq, "items") else enumerate(seq)


def Select(seq, i):
    """``seq[i]`` for a concrete or symbolic index (an If-chain over the positions; a
    sequence of unbounded length selects itself)."""
    if hasattr(seq, "select"):
        return seq.select(i)
    if not is_sym(i):
        return seq[i]
    out = seq[0]
    for j in range(1, len(seq)):
        out = Ite(i == j, seq[j], out)
    return out


def Store(seq, i, v):
    """``seq`` with position i replaced by v, for a concrete or symbolic index."""
    if hasattr(seq, "store"):
        return seq.store(i, v)
    if not is_sym(i):
        return seq[:i] + (v,) + seq[i + 1:]
    return tuple(Ite(i == j, v, x) for j, x in enumerate(seq))
