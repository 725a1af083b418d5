"""The runtime arena refuses through the spec's own guards (spec.arena.can_take / can_give):
a seeded bookkeeping bug (a free list naming a held page, a block slot naming another block's
page) is refused with InvariantViolation("arena_routing") naming the page and the pool key,
and the arena changes nothing; with the spec guard's conjunct mutated, the same bug goes
through and only the checked-mode sweep (the spec's routing rules) finds the damage."""
import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache.arena import ARENA_RUN_MIN
from hybridkv.errors import InvariantViolation
from proofs.mutate import applied, mutants
from spec import arena as spec_arena
from spec.arena import PAGE_OWNED
from spec.common import FREE, READY
from tests.cache.helpers import LAY, P40, run

MUTANT = {m.name: m for m in mutants(spec_arena.GUARDS)}


def _arena_state(a):
    return bytes(a.page_state), list(a.owner), list(a.owner_block), list(a.free), \
        dict(a.pages_held)


def _cached():
    """A manager whose blocks of one request stay cached (READY) after its free."""
    m = CacheManager(LAY, num_pages=64, checked=True)
    run(m, "a", P40)
    return m


def _two_ready(m):
    """(pool key, pool, b1, b2): two READY blocks of one pool."""
    for pk, pool in m.pools.items():
        ready = [b for b, r in enumerate(pool.recs) if r.st == READY]
        if len(ready) >= 2:
            return pk, pool, ready[0], ready[1]
    raise AssertionError("no pool with two READY blocks")


def test_free_list_naming_a_held_page_is_refused_by_can_take():
    m = _cached()
    a = m.arena
    held = next(p for p in range(a.num_pages) if a.page_state[p] == PAGE_OWNED)
    a.free.append(held)                      # seeded bug: a held page back on the free list
    before = _arena_state(a)
    with pytest.raises(InvariantViolation) as e:
        a.take(("swa", "swa"), 7)
    assert e.value.value == "arena_routing"
    assert str(held) in str(e.value) and "('swa', 'swa')" in str(e.value)
    assert _arena_state(a) == before         # refused: nothing changed


def test_without_the_spec_guard_the_held_page_is_retyped():
    m = _cached()
    a = m.arena
    held = next(p for p in range(a.num_pages) if a.page_state[p] == PAGE_OWNED)
    owner = a.owner_of(held)
    a.free.append(held)
    with applied(MUTANT["arena.can_take#0"], spec_arena.GUARDS):
        assert a.take(("swa", "swa"), 7) == held      # the runtime asked the spec: it said yes
    assert a.owner_of(held) == ("swa", "swa", 7) != owner
    bad = a.check(m.pools)
    assert ("page-owner", owner[:2], owner[2], held) in bad


def test_block_slot_naming_another_blocks_page_is_refused_by_can_give():
    m = _cached()
    pk, pool, b1, b2 = _two_ready(m)
    a, page2 = m.arena, pool.phys[b2]
    pool.phys[b1] = page2                    # seeded bug: b1's slot names b2's page
    before = _arena_state(a)
    with pytest.raises(InvariantViolation) as e:
        pool.fire(b1, "evict")               # b1 returns to FREE: it gives "its" page back
    assert e.value.value == "arena_routing"
    assert str(page2) in str(e.value) and str(pk) in str(e.value)
    assert _arena_state(a) == before and a.owner_of(page2) == (*pk, b2)


def test_without_the_spec_guard_another_blocks_page_is_freed():
    m = _cached()
    pk, pool, b1, b2 = _two_ready(m)
    a, page1, page2 = m.arena, pool.phys[b1], pool.phys[b2]
    pool.phys[b1] = page2
    with applied(MUTANT["arena.can_give#2"], spec_arena.GUARDS):
        pool.fire(b1, "evict")               # the give by the wrong block goes through
    assert pool.recs[b1].st == FREE and a.page_state[page2] != PAGE_OWNED
    bad = a.check(m.pools)
    assert ("block-pages", pk, b1, FREE, [page1]) in bad      # FREE, still owns its page
    assert ("block-pages", pk, b2, READY, []) in bad          # held, its page is free


def test_relocation_moves_a_block_to_a_fresh_page_of_its_own():
    """Relocation (spec relocate): the block takes a FREE page and gives its old one back, both
    through the guards; the arena's sweep stays clean."""
    m = _cached()
    pk, pool, b, _ = _two_ready(m)
    a, old = m.arena, pool.phys[b]
    m.relocate(*pk, b)
    new = pool.phys[b]
    assert new != old and a.owner_of(new) == (*pk, b) and a.owner_of(old)[0] == spec_arena.NO_KIND
    assert a.check(m.pools) == []
    m.check_invariants()


def test_check_applies_the_spec_page_rule():
    """Arena.check calls spec.arena.page_owner_ok: a FREE page naming an owner is reported."""
    m = _cached()
    a = m.arena
    assert a.check(m.pools) == []
    page = a.free[0]
    a.owner[page], a.owner_block[page] = ("comp", "csa"), 0      # seeded: owner left behind
    assert ("page-owner-state", page, spec_arena.PAGE_FREE, ("comp", "csa")) in a.check(m.pools)


def _ready_run(n):
    """(manager, pool key, pool, n READY blocks of one pool of one-page blocks)."""
    m = CacheManager(LAY, num_pages=256, checked=True)
    run(m, "a", [(7 * i + 3) % 250 for i in range(400)])
    for pk, pool in m.pools.items():
        ready = [b for b, r in enumerate(pool.recs) if r.st == READY]
        if len(ready) >= n and m.arena.pages_per_block(pk) == 1:
            return m, pk, pool, ready[:n]
    raise AssertionError(f"no pool of one-page blocks with {n} READY blocks")


def test_a_run_giving_another_blocks_page_is_refused_by_can_give():
    """The run path (Pool.fire_run as one run, Arena.give_run: one guard call over the run's
    pages): a run of READY blocks back to FREE where one block's slot names another block's
    page is refused naming that page before any record changes: the blocks, the pool and the
    arena stay as they were; with can_give's block conjunct mutated it goes through."""
    m, pk, pool, blocks = _ready_run(12)
    pool.run_min = 2                         # (one gather, one guard call, one scatter)
    assert len(blocks) - 1 >= ARENA_RUN_MIN
    a, victim, other = m.arena, blocks[5], blocks[-1]
    page = pool.phys[other]
    pool.phys[victim] = page                 # seeded bug: its slot names another's page
    before, records = _arena_state(a), [pool.recs[b] for b in blocks]
    free_before = (pool.n_free, list(pool.free))
    with pytest.raises(InvariantViolation) as e:
        pool.fire_run(blocks[:-1], "evict")
    assert e.value.value == "arena_routing" and str(page) in str(e.value)
    assert _arena_state(a) == before and a.owner_of(page) == (*pk, other)
    assert [pool.recs[b] for b in blocks] == records and (pool.n_free, pool.free) == free_before
    with applied(MUTANT["arena.can_give#2"], spec_arena.GUARDS):
        pool.fire_run(blocks[:-1], "evict")
    assert a.page_state[page] != PAGE_OWNED and pool.recs[other].st == READY
    assert ("block-pages", pk, other, READY, []) in a.check(m.pools)


def test_a_refused_give_leaves_the_block_as_it_was():
    """The single-block path checks the arena first too: the block whose slot names another
    block's page keeps its READY record when the give is refused."""
    m = _cached()
    pk, pool, b1, b2 = _two_ready(m)
    record = pool.recs[b1]
    pool.phys[b1] = pool.phys[b2]
    with pytest.raises(InvariantViolation):
        pool.fire(b1, "evict")
    assert pool.recs[b1] == record and pool.recs[b1].st == READY


def test_a_run_taking_a_held_page_is_refused_by_can_take():
    """Arena.take_run checks the pages it pops (can_take over them at once): a held page
    among the free list's top ones refuses the whole run and nothing changes."""
    m, pk, pool, blocks = _ready_run(2)
    a = m.arena
    held = pool.phys[blocks[0]]
    a.free.insert(len(a.free) - 3, held)     # seeded: a held page among the next 10 taken
    before = _arena_state(a)
    with pytest.raises(InvariantViolation) as e:
        a.take_run(("swa", "swa"), list(range(10)))
    assert e.value.value == "arena_routing" and str(held) in str(e.value)
    assert _arena_state(a) == before
