"""Seed bugs into spec functions by rewriting their AST and swapping ``__code__`` in place,
so every existing reference (machine tables, step) runs the mutant until restored."""
import ast
import contextlib
import inspect
import textwrap


class _DropConjuncts(ast.NodeTransformer):
    """Replace each argument of ``And(...)`` (or element of a list literal) for which
    ``pred(source_of_node)`` holds by ``True``."""

    def __init__(self, pred):
        self.pred, self.dropped = pred, []

    def _filter(self, nodes):
        out = []
        for n in nodes:
            src = ast.unparse(n)
            if self.pred(src):
                self.dropped.append(src)
                out.append(ast.Constant(True))
            else:
                out.append(n)
        return out

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "And":
            node.args = self._filter(node.args)
        return node

    def visit_List(self, node):
        self.generic_visit(node)
        node.elts = self._filter(node.elts)
        return node


@contextlib.contextmanager
def drop_conjuncts(fn, pred):
    """Within the block, ``fn`` runs with matching conjuncts replaced by True."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    tx = _DropConjuncts(pred)
    tree = ast.fix_missing_locations(tx.visit(tree))
    assert tx.dropped, f"no conjunct of {fn.__name__} matched"
    ns = {}
    exec(compile(tree, inspect.getsourcefile(fn), "exec"), fn.__globals__, ns)
    original = fn.__code__
    fn.__code__ = ns[fn.__name__].__code__
    try:
        yield tx.dropped
    finally:
        fn.__code__ = original
