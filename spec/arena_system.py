"""The block arena composed with the block machines: pools of blocks drawing pages from one
arena, the step that moves a block and the arena together, and state routing over it.

A pool is a (kind, group) key; each of its blocks moves through its kind's machine
(``spec.state.MACHINES``), by the spec's own events.  A block leaves FREE only taking a page
in the same step (write, draft, load_start), returns to FREE only giving a page back (reject,
evict, load_bad, drop_stale), and a relocation takes a fresh page and gives the old one
(``hybridkv.cache.arena_pool.ArenaPool``: ``_moved``, ``_fresh_slot``, ``_retire_slot``).

The page a block takes or gives is an argument: whatever page the runtime's bookkeeping
names (its free list, a block's slot), the arena's guards (``spec.arena``) decide.  The
block machines' own guards are left out (every guard outcome is allowed), so what is proven
here holds whatever the blocks' records say: an over-approximation of the block machines.
"""
from typing import NamedTuple

from spec.arena import (PAGE_FREE, PAGE_OWNED, PageRec, block_pages_ok, can_give, can_take,
                        give, page_owner_ok, take)
from spec.common import FREE
from spec.dual import And, Count, Items, Or, Select, Store, Sum
from spec.state import KINDS, MACHINES
from spec.table import compile_machine

COMP, TAIL, SWA, IDX = range(len(KINDS))


class ArenaConfig(NamedTuple):
    n_pages: int = 3
    n_blocks: int = 2                                    # blocks per pool
    pools: tuple = ((COMP, 0), (COMP, 1), (SWA, 0), (IDX, 0))   # (kind, group) per pool:
    # two groups of one kind, and a second kind at the same group number and block ids


class Block(NamedTuple):
    st: int = FREE     # the block's state in its kind's machine


class ArenaSys(NamedTuple):
    pages: tuple       # PageRec per page
    blocks: tuple      # per pool (in ``ArenaConfig.pools`` order): a Block per block


def initial(c):
    return ArenaSys(pages=tuple(PageRec() for _ in range(c.n_pages)),
                    blocks=tuple(tuple(Block() for _ in range(c.n_blocks)) for _ in c.pools))


def moves(kind):
    """event -> (source, target) of every transition of the kind's machine that changes the
    block's state, plus relocate (its page changes); self-loops leave the arena alone."""
    return {event: (r.source, r.target)
            for event, rows in compile_machine(MACHINES[kind]).items() for r in rows
            if Or(r.source != r.target, event == "relocate")}


# the arena's two steps on page p, for block b of pool j -----------------------------------
def _take(s, c, j, b, p):
    kind, group = c.pools[j]
    page = Select(s.pages, p)
    return can_take(page.st), s._replace(pages=Store(s.pages, p, take(page, kind, group, b)))


def _give(s, c, j, b, p):
    kind, group = c.pools[j]
    page = Select(s.pages, p)
    return (can_give(page.kind, page.group, page.block, kind, group, b),
            s._replace(pages=Store(s.pages, p, give(page))))


def _block(s, c, event, j, b):
    source, target = moves(c.pools[j][0])[event]
    blk = Select(s.blocks[j], b)
    pool = Store(s.blocks[j], b, blk._replace(st=target))
    return blk.st == source, s._replace(blocks=Store(s.blocks, j, pool))


# composed actions: (enabled, next state), the next state computed even when disabled -------
def alloc(s, c, event, j, b, p):
    """Block b of pool j leaves FREE (write, draft, load_start), taking page p."""
    en_b, s2 = _block(s, c, event, j, b)
    en_p, s3 = _take(s2, c, j, b, p)
    return And(en_b, en_p), s3


def release(s, c, event, j, b, p):
    """Block b of pool j returns to FREE (reject, evict, load_bad, drop_stale), giving page p
    back."""
    en_b, s2 = _block(s, c, event, j, b)
    en_p, s3 = _give(s2, c, j, b, p)
    return And(en_b, en_p), s3


def relocate(s, c, event, j, b, p, q):
    """A READY block moves: it takes page q (a copy lands there), then gives page p back."""
    en_b, s2 = _block(s, c, event, j, b)
    en_t, s3 = _take(s2, c, j, b, q)
    en_g, s4 = _give(s3, c, j, b, p)
    return And(en_b, en_t, en_g), s4


def settle(s, c, event, j, b):
    """Between two non-FREE states (seal, pin, unpin, load_ok, mark_stale): no arena step."""
    return _block(s, c, event, j, b)


_BY_ENDS = {(True, False): alloc, (False, True): release, (False, False): settle}
PARAMS = {alloc: ("b", "p"), release: ("b", "p"), relocate: ("b", "p", "q"), settle: ("b",)}


def action(kind, event):
    """The composed action ``event`` is for a block of this kind."""
    source, target = moves(kind)[event]
    return {"relocate": relocate}.get(event, _BY_ENDS[(source == FREE, target == FREE)])


def step(s, c, event, args):
    """(enabled, next state) of ``event`` with args (pool j, block b, pages...)."""
    return action(c.pools[args[0]][0], event)(s, c, event, *args)


def domains(c):
    """Per parameter name, its values in configuration c."""
    return {"b": range(c.n_blocks), "p": range(c.n_pages), "q": range(c.n_pages)}


# state routing over the arena --------------------------------------------------------------
def pages_owned(s, c, j, b):
    """How many pages name block b of pool j as their owner."""
    kind, group = c.pools[j]
    return Count(And(p.kind == kind, p.group == group, p.block == b) for p in s.pages)


def arena_routing(s, c):
    """I2 page by page: a FREE page has no owner and an OWNED one has one; every non-FREE
    block of every pool owns exactly one page, a FREE block none.  A page names one owner, so
    no page is held by two blocks (of one kind or of two); a page changes owner only through
    FREE (``can_take``), so it is retyped only while FREE."""
    return And(*[page_owner_ok(p.st, p.kind) for p in s.pages],
               *[block_pages_ok(blk.st, pages_owned(s, c, j, b))
                 for j, blocks in enumerate(s.blocks) for b, blk in Items(blocks)])


def arena_accounting(s, c):
    """Pages OWNED == blocks not FREE, over every pool: no page leaked (owned by nobody's
    block, or by a block that does not exist) and none missing."""
    return (Count(p.st == PAGE_OWNED for p in s.pages)
            == Sum(Count(blk.st != FREE for blk in blocks) for blocks in s.blocks))


def page_count(s, c):
    """Pages OWNED + pages FREE == the arena's pages (every page is in one of the two
    states): a statement about one size, so the parametric tier leaves it out."""
    return (Count(p.st == PAGE_OWNED for p in s.pages)
            + Count(p.st == PAGE_FREE for p in s.pages)) == c.n_pages


INVARIANTS = {f.__name__: f for f in (arena_routing, arena_accounting, page_count)}
