"""AST lint: spec code never uses Python's and/or/not/if/conditional expressions or chained
comparisons (they silently misbehave on Z3 terms); only the dual helpers may."""
import ast
import pathlib

import pytest

SPEC = pathlib.Path(__file__).resolve().parents[2] / "spec"
EXEMPT = {"dual.py"}   # the helpers themselves dispatch on concrete vs symbolic


def violations(source, filename="<src>"):
    out = []
    for node in ast.walk(ast.parse(source)):
        bad = None
        if isinstance(node, ast.BoolOp):
            bad = type(node.op).__name__.lower()
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            bad = "not"
        elif isinstance(node, ast.IfExp):
            bad = "conditional expression"
        elif isinstance(node, ast.If):
            bad = "if statement"
        elif isinstance(node, ast.Compare) and len(node.ops) > 1:
            bad = "chained comparison"
        if bad:
            out.append(f"{filename}:{node.lineno}: {bad}")
    return out


@pytest.mark.parametrize("path", sorted(p for p in SPEC.glob("*.py") if p.name not in EXEMPT),
                         ids=lambda p: p.name)
def test_spec_file_uses_only_dual_helpers(path):
    assert violations(path.read_text(), path.name) == []


@pytest.mark.parametrize("snippet, kind", [
    ("def can_x(o, c):\n    return o.a == 1 and o.b == 2\n", "and"),
    ("def can_x(o, c):\n    return o.a == 1 or o.b\n", "or"),
    ("def can_x(o, c):\n    return not o.a\n", "not"),
    ("def can_x(o, c):\n    return 1 if o.a else 0\n", "conditional expression"),
    ("def can_x(o, c):\n    if o.a:\n        return True\n    return False\n", "if statement"),
    ("def can_x(o, c):\n    return 0 <= o.a < 5\n", "chained comparison"),
])
def test_lint_catches_each_trap(snippet, kind):
    found = violations(snippet)
    assert found and kind in found[0]


def test_lint_passes_dual_style():
    assert violations("def can_x(o, c):\n    return And(o.a == 1, Not(o.b), o.c < 5)\n") == []
