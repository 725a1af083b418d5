"""A page of the one block arena: every (kind, group) pool draws its blocks' memory from one
set of equal-size pages, and a page's owner says whose bytes it holds.

A page is FREE (nobody's) or OWNED by one block of one pool: (kind, group, block).  ``take``
gives a FREE page an owner, and with it a type (its bytes now hold that pool's layout);
``give`` returns it, by its owner only, to FREE.  So a page is retyped only while FREE, and
nothing is ever written through another kind's table (I2, state routing).  Capacity moves
between kinds only as FREE pages.

The owner fields mean something only while OWNED: ``kind == NO_KIND`` marks a page nobody
owns (``give`` clears it; the group and block fields then keep stale values nobody reads).
The guards take scalars, so the runtime (``hybridkv.cache.arena``) calls them on its own
arrays and the prover (``proofs.arena``) on Z3 terms; ``PageMachine`` declares the same rules
(a test keeps the two in agreement).
"""
from typing import NamedTuple

from statemachine import State, StateMachine

from spec.common import FREE
from spec.dual import And, If, Not, Or
from spec.state import KINDS

PAGE_FREE, PAGE_OWNED = 0, 1
NO_KIND = len(KINDS)          # the owner kind of a page nobody owns (kinds are 0..3)


class PageRec(NamedTuple):
    st: int = PAGE_FREE
    kind: int = NO_KIND   # owner's kind (KINDS index); NO_KIND while FREE
    group: int = 0        # owner's layer group (its pool is (kind, group))
    block: int = 0        # owner's block in that pool: the block whose table slot names the page


def can_take(page_state):
    """Only a FREE page gets an owner: retyping a page that a block still holds would hand
    its bytes to a second table (of another kind, or another block) while the first still
    reads and writes them."""
    return page_state == PAGE_FREE


def can_give(owner_kind, owner_group, owner_block, kind, group, block):
    """Only the block that owns a page gives it back: a give by another kind, another group's
    pool or another block of the same pool (a stale or wrong page id in its bookkeeping)
    would free bytes the owner still holds.  A FREE page has no owner (kind NO_KIND), so it
    is never given twice."""
    return And(owner_kind == kind, owner_group == group, owner_block == block)


# effects ----------------------------------------------------------------------------------
def take(page, kind, group, block):
    return PageRec(PAGE_OWNED, kind, group, block)


def give(page):
    return page._replace(st=PAGE_FREE, kind=NO_KIND)


# what must hold of each page and each block (stated per element: the prover closes them over
# every page and block, the runtime's checked mode calls them on its own arrays) ------------
def page_owner_ok(page_state, owner_kind):
    """A page is FREE with no owner, or OWNED with one."""
    return Or(And(page_state == PAGE_FREE, owner_kind == NO_KIND),
              And(page_state == PAGE_OWNED, Not(owner_kind == NO_KIND)))


def block_pages_ok(block_state, pages_owned, pages_per_block=1):
    """A block holds no page while FREE, and while it is not FREE between one (its first
    page, its slot, taken when it left FREE) and the k its pool's blocks span when an engine
    names every page-sized unit (runtime ``block_pages``: a window block's later pages are
    taken as positions reach them and given back as the window slides past them).  With
    k = 1: exactly one."""
    return If(block_state == FREE, pages_owned == 0,
              And(1 <= pages_owned, pages_owned <= pages_per_block))


class PageMachine(StateMachine):
    """An arena page: free -> owned (take: only from free, by anyone) -> free (give: only by
    its owner).  ``send("give", owner_kind=..., ..., block=...)`` passes the guard's scalars."""

    free = State(initial=True, value=PAGE_FREE)
    owned = State(value=PAGE_OWNED)

    take = free.to(owned)
    give = owned.to(free, cond=can_give)


# the arena's guards, for proofs.arena's mutants: kept out of spec.GUARDS, whose mutants run
# against the whole-system model (which has no pages) and would all come back "unused"
GUARDS = {"arena.can_take": can_take, "arena.can_give": can_give}
