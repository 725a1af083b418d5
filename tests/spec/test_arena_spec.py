"""The arena page machine (spec.arena): the python-statemachine declaration and the scalar
guards the runtime and the prover call agree, and the guards are dual-mode."""
import itertools

import pytest
import z3
from statemachine.exceptions import TransitionNotAllowed

from spec import dual
from spec.arena import (NO_KIND, PAGE_FREE, PAGE_OWNED, PageMachine, PageRec, block_pages_ok,
                        can_give, can_take, give, page_owner_ok, take)
from spec.common import FREE, READY

OWNERS = [(k, g, b) for k in (0, 2) for g in (0, 1) for b in (0, 1)]
PAGES = [PageRec()] + [PageRec(PAGE_OWNED, *o) for o in OWNERS]


def _machine_allows(page, event, giver):
    sm = PageMachine(start_value=page.st)
    try:
        sm.send(event, owner_kind=page.kind, owner_group=page.group, owner_block=page.block,
                kind=giver[0], group=giver[1], block=giver[2])
    except TransitionNotAllowed:
        return False
    return True


@pytest.mark.parametrize("page, giver", list(itertools.product(PAGES, OWNERS)))
def test_machine_and_guards_agree(page, giver):
    assert _machine_allows(page, "take", giver) == can_take(page.st)
    assert _machine_allows(page, "give", giver) == can_give(page.kind, page.group, page.block,
                                                            *giver)


def test_take_and_give_effects():
    p = take(PageRec(), 2, 1, 0)
    assert p == PageRec(PAGE_OWNED, 2, 1, 0) and page_owner_ok(p.st, p.kind)
    q = give(p)
    assert q.st == PAGE_FREE and q.kind == NO_KIND and page_owner_ok(q.st, q.kind)
    assert not page_owner_ok(PAGE_FREE, 2) and not page_owner_ok(PAGE_OWNED, NO_KIND)
    assert block_pages_ok(FREE, 0) and block_pages_ok(READY, 1)
    assert not block_pages_ok(FREE, 1) and not block_pages_ok(READY, 0)
    assert not block_pages_ok(READY, 2)


def test_guards_are_dual_mode():
    """On Z3 terms the guards build formulas that agree with their Python values."""
    dual.set_width(8)
    try:
        v = [z3.BitVec(n, 8) for n in ("st", "ok", "og", "ob", "k", "g", "b")]
        f_take, f_give = can_take(v[0]), can_give(*v[1:])
        assert isinstance(f_take, z3.BoolRef) and isinstance(f_give, z3.BoolRef)
        for page, giver in itertools.product(PAGES, OWNERS):
            vals = (page.st, page.kind, page.group, page.block, *giver)
            sub = [(x, z3.BitVecVal(y, 8)) for x, y in zip(v, vals)]
            assert z3.is_true(z3.simplify(z3.substitute(f_take, *sub))) == can_take(page.st)
            assert z3.is_true(z3.simplify(z3.substitute(f_give, *sub))) == can_give(*vals[1:])
    finally:
        dual.set_width(None)
