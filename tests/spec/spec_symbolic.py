"""Test helpers: turn concrete spec values into Z3 bit-vector variables and back."""
import z3

from spec import dual

WIDTH = 8


def symbolize(value, name, pairs):
    """Same shape as ``value`` with every int leaf a fresh BitVec; ``pairs`` collects
    (variable, concrete value) for substitution."""
    if isinstance(value, bool):
        v = z3.Bool(name)
        pairs.append((v, z3.BoolVal(value)))
        return v
    if isinstance(value, int):
        v = z3.BitVec(name, WIDTH)
        pairs.append((v, z3.BitVecVal(value, WIDTH)))
        return v
    if isinstance(value, tuple):
        vals = [symbolize(x, f"{name}.{i}", pairs) for i, x in enumerate(value)]
        return type(value)(*vals) if hasattr(value, "_fields") else tuple(vals)
    return value


def _signed(v):
    if isinstance(v, bool):
        return v
    return v - (1 << WIDTH) if v >= 1 << (WIDTH - 1) else v


def evaluate(term, pairs):
    """The concrete value of a term under the substitution (bit-vectors read as signed)."""
    direct = {var.get_id(): dual.concrete(val) for var, val in pairs}
    return _eval(term, pairs, direct)


def _eval(term, pairs, direct):
    if isinstance(term, tuple):
        vals = [_eval(x, pairs, direct) for x in term]
        return type(term)(*vals) if hasattr(term, "_fields") else tuple(vals)
    if not dual.is_sym(term):
        return term
    if term.get_id() in direct:          # an untouched leaf: the variable itself
        return _signed(direct[term.get_id()])
    return _signed(dual.concrete(z3.substitute(term, *pairs)))
