"""Guard mutants: one conjunct of one spec guard replaced by ``True``.

Conjuncts of a guard (enumerated from ``spec.GUARDS``): each top-level argument of the
``And(...)`` its ``return`` builds (a starred argument counts as one), with an argument
``can_hit_groups([...])`` split into its list elements; a guard whose return is not an
``And`` has a single conjunct, the whole expression.  ``applied(mutant)`` recompiles the
guard with the conjunct replaced and swaps ``fn.__code__`` in place, so every reference
(machine tables, ``step``) runs the mutant until the block exits; it always restores.
"""
import ast
import contextlib
import inspect
import sys
import textwrap
from typing import NamedTuple

import spec


class MutantError(LookupError):
    """A mutant name that does not match the spec's guards; ``value`` is the name."""

    def __init__(self, msg, value):
        super().__init__(f"{msg}: {value!r}")
        self.value = value


class Mutant(NamedTuple):
    guard: str       # key in spec.GUARDS, e.g. "system.can_lookup"
    index: int       # conjunct number within the guard
    conjunct: str    # its source text

    @property
    def name(self):
        return f"{self.guard}#{self.index}"

    def as_json(self):
        return {"guard": self.guard, "index": self.index, "conjunct": self.conjunct}


def _tree(fn):
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _conjunct_nodes(tree):
    """The conjunct nodes of the (single) function in ``tree``, in source order."""
    fdef = tree.body[0]
    rets = [n for n in ast.walk(fdef) if isinstance(n, ast.Return) and n.value is not None]
    out = []
    for ret in rets:
        e = ret.value
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "And":
            for a in e.args:
                if (isinstance(a, ast.Call) and isinstance(a.func, ast.Name)
                        and a.func.id == "can_hit_groups" and a.args
                        and isinstance(a.args[0], ast.List)):
                    out += list(a.args[0].elts)
                else:
                    out.append(a)
        else:
            out.append(e)
    return out


def mutants(guards=None):
    """Every (guard, conjunct) mutant of the spec's registry."""
    out = []
    for gname, fn in sorted((guards or spec.GUARDS).items()):
        for j, node in enumerate(_conjunct_nodes(_tree(fn))):
            out.append(Mutant(gname, j, ast.unparse(node)))
    return out


def find(name):
    """The mutant named ``guard#index`` (as written in a trace)."""
    for m in mutants():
        if m.name == name:
            return m
    raise MutantError("no such mutant", name)


class _Replace(ast.NodeTransformer):
    def __init__(self, target):
        self.target = target

    def visit(self, node):
        if node is self.target:
            return ast.copy_location(ast.Constant(True), node)
        return super().visit(node)


@contextlib.contextmanager
def applied(mutant, guards=None):
    """Run the block with ``mutant`` in force (None: no mutant); ``guards``: the registry it
    names a guard of (default ``spec.GUARDS``; ``spec.arena.GUARDS`` for the arena's)."""
    if mutant is None:
        yield None
        return
    fn = (guards or spec.GUARDS).get(mutant.guard)
    if fn is None:
        raise MutantError("unknown guard", mutant.guard)
    tree = _tree(fn)
    nodes = _conjunct_nodes(tree)
    if mutant.index >= len(nodes) or ast.unparse(nodes[mutant.index]) != mutant.conjunct:
        raise MutantError("conjunct no longer matches the spec", mutant.as_json())
    tree = ast.fix_missing_locations(_Replace(nodes[mutant.index]).visit(tree))
    first = inspect.getsourcelines(fn)[1]
    ast.increment_lineno(tree, first - 1)
    ns = {}
    exec(compile(tree, inspect.getsourcefile(fn), "exec"), fn.__globals__, ns)
    original = fn.__code__
    fn.__code__ = ns[fn.__name__].__code__
    try:
        yield mutant
    finally:
        fn.__code__ = original


def guards_called(build):
    """Names of spec guards that ``build()`` calls (e.g. while encoding the transition
    relation): a guard never called cannot matter to the model."""
    codes = {fn.__code__: name for name, fn in spec.GUARDS.items()}
    seen = set()

    def prof(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            seen.add(codes[frame.f_code])

    old = sys.getprofile()
    sys.setprofile(prof)
    try:
        build()
    finally:
        sys.setprofile(old)
    return seen
