"""A run of blocks leaving or returning to FREE takes or gives its pages as one run
(Arena.take_run / give_run): the spec's ``can_take`` / ``can_give`` evaluated once over the
run's pages in array mode, the pages owned and freed in the order the block-by-block path
takes and gives them.  Differential against that path (``ARENA_RUN_MIN`` out of reach) on
the same calls; seeded bookkeeping bugs refused by the run's guard with nothing changed in
the arena, and let through when the spec guard's conjunct is mutated (the run asks the spec,
not a copy of it)."""
import pytest

import hybridkv.cache.arena_pool as arena_pool
from hybridkv.cache import CacheManager
from hybridkv.cache.arena import Arena
from hybridkv.errors import InvariantViolation
from proofs.mutate import applied, mutants
from spec import arena as spec_arena
from spec.arena import PAGE_OWNED
from spec.common import READY
from tests.cache.helpers import LAY, run
from tests.cache.test_arena_guards import _arena_state

MUTANT = {m.name: m for m in mutants(spec_arena.GUARDS)}
PROMPTS = [[(7 * i + j) % 250 for i in range(420 + 60 * j)] for j in range(4)]
PAGES = 420


def _counted(monkeypatch):
    calls = {"take_run": 0, "give_run": 0}
    for name in calls:
        orig = getattr(Arena, name)

        def wrapped(self, *a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            return _orig(self, *a, **kw)
        monkeypatch.setattr(Arena, name, wrapped)
    return calls


def test_runs_own_and_free_the_pages_block_by_block_does(monkeypatch):
    runs = CacheManager(LAY, num_pages=PAGES, checked=True)
    calls = _counted(monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(arena_pool, "ARENA_RUN_MIN", 10 ** 9)
        ref = CacheManager(LAY, num_pages=PAGES, checked=True)
        for i, prompt in enumerate(PROMPTS * 2):      # the second round evicts under pressure
            run(ref, f"r{i}", prompt)
    assert calls == {"take_run": 0, "give_run": 0}
    ref_state = _arena_state(ref.arena), ref.stats()["arena"]
    for i, prompt in enumerate(PROMPTS * 2):
        run(runs, f"r{i}", prompt)
    assert calls["take_run"] > 0 and calls["give_run"] > 0
    assert (_arena_state(runs.arena), runs.stats()["arena"]) == ref_state
    runs.check_invariants()


def _ready_run(m):
    """(pool key, pool, blocks): READY blocks of one pool, enough for fire_run's runs."""
    for pk, pool in m.pools.items():
        n = max(pool.run_min, arena_pool.ARENA_RUN_MIN)
        ready = [b for b, r in enumerate(pool.recs) if r.st == READY]
        if len(ready) >= n:
            return pk, pool, ready[:n]
    raise AssertionError("no pool with a run of READY blocks")


def _cached():
    m = CacheManager(LAY, num_pages=PAGES, checked=True)
    run(m, "a", PROMPTS[3])
    return m


def test_a_run_given_back_with_another_blocks_page_is_refused_by_can_give():
    m = _cached()
    pk, pool, blocks = _ready_run(m)
    a, page = m.arena, pool.phys[blocks[-1]]
    pool.phys[blocks[2]] = page                  # seeded bug: a slot names another block's page
    before = _arena_state(a)
    with pytest.raises(InvariantViolation) as e:
        pool.fire_run(blocks, "evict")
    assert e.value.value == "arena_routing" and str(page) in str(e.value)
    assert _arena_state(a) == before


def test_without_the_spec_guard_the_run_frees_another_blocks_page():
    m = _cached()
    pk, pool, blocks = _ready_run(m)
    a, page = m.arena, pool.phys[blocks[-1]]
    pool.phys[blocks[2]] = page
    with applied(MUTANT["arena.can_give#2"], spec_arena.GUARDS):
        pool.fire_run(blocks[:-1], "evict")      # the give by the wrong block goes through
    assert a.page_state[page] != PAGE_OWNED
    assert ("block-pages", pk, blocks[-1], READY, []) in a.check(m.pools)


def test_a_run_taking_a_held_page_from_the_free_list_is_refused_by_can_take():
    m = _cached()
    a = m.arena
    held = next(p for p in range(a.num_pages) if a.page_state[p] == PAGE_OWNED)
    a.free.insert(len(a.free) - 3, held)         # seeded: a held page 4th from the top
    before = _arena_state(a)
    with pytest.raises(InvariantViolation) as e:
        a.take_run(("swa", "swa"), list(range(100, 108)))
    assert e.value.value == "arena_routing" and str(held) in str(e.value)
    assert _arena_state(a) == before
    with applied(MUTANT["arena.can_take#0"], spec_arena.GUARDS):
        slots = a.take_run(("swa", "swa"), list(range(100, 108)))
    assert held in slots and a.owner_of(held)[:2] == ("swa", "swa")


def test_window_sub_pages_reached_as_a_run_take_what_block_by_block_takes(monkeypatch):
    """A prefill chunk's window pages reach their sub-pages as one run (``Arena.reach_run``:
    the owners asked once, the free pages' states once) and own the pages the block-by-block
    path owns, in the same order; decodes reach one page at a time, skipping those held."""
    from hybridkv.cache import arena as arena_module
    from tests.cache.test_arena_block_pages import K, LAY as PAGED

    def serve(m):
        for i, prompt in enumerate(PROMPTS * 2):
            run(m, f"r{i}", prompt[:300], decode=range(1, 12))
        return _arena_state(m.arena), m.stats()["arena"]
    calls = {"reach_run": 0}
    orig = Arena.reach_run

    def counted(self, pool_key, blocks, pages, subs):
        calls["reach_run"] += len(blocks) >= arena_module.ARENA_RUN_MIN
        return orig(self, pool_key, blocks, pages, subs)
    monkeypatch.setattr(Arena, "reach_run", counted)
    with monkeypatch.context() as mp:
        mp.setattr(arena_module, "ARENA_RUN_MIN", 10 ** 9)
        mp.setattr(arena_pool, "ARENA_RUN_MIN", 10 ** 9)
        ref = CacheManager(PAGED, num_pages=PAGES, device="meta", checked=True, block_pages=K)
        want = serve(ref)
    assert calls["reach_run"] == 0
    runs = CacheManager(PAGED, num_pages=PAGES, device="meta", checked=True, block_pages=K)
    assert serve(runs) == want and calls["reach_run"] > 0
    runs.check_invariants()


def test_a_run_growing_a_block_it_does_not_own_is_refused_and_changes_nothing():
    from tests.cache.test_arena_block_pages import K, LAY as PAGED
    m = CacheManager(PAGED, num_pages=PAGES, device="meta", checked=True, block_pages=K)
    m.lookup("a", PROMPTS[0][:300])
    m.allocate("a", 300)
    pool = m.pools[("swa", "g1")]
    blocks = [b for b, r in enumerate(pool.recs) if r.st != 0][:10]
    a = m.arena
    for b in blocks:                                  # free their sub-pages again
        for s in range(1, K[("swa", "g1")]):
            pool.give_sub(b, s)
    before = _arena_state(a)
    pages = [pool.phys[b] for b in blocks]
    pages[4] = pool.phys[blocks[5]]                   # seeded: a slot naming another's page
    with pytest.raises(InvariantViolation) as e:
        a.reach_run(pool.key, blocks, pages, [[1, 2]] * len(blocks))
    assert e.value.value == "arena_routing" and _arena_state(a) == before
    with applied(MUTANT["arena.can_give#2"], spec_arena.GUARDS):
        assert a.reach_run(pool.key, blocks, pages, [[1, 2]] * len(blocks)) == 20


def test_sub_pages_asked_as_a_range_take_what_the_same_list_takes():
    """``reach_run`` with each block's sub-pages as a ``range`` (WindowSubPages' runs: read
    off at once where the block holds none of them) takes exactly the pages the same subs as
    lists take, with some of them already held (those are not taken again)."""
    from tests.cache.test_arena_block_pages import K, LAY as PAGED
    k = K[("swa", "g1")]
    states = []
    for as_range in (False, True):
        m = CacheManager(PAGED, num_pages=PAGES, device="meta", checked=True, block_pages=K)
        m.lookup("a", PROMPTS[0][:300])
        m.allocate("a", 300)
        pool = m.pools[("swa", "g1")]
        blocks = [b for b, r in enumerate(pool.recs) if r.st != 0][:12]
        for i, b in enumerate(blocks):                # every sub-page free, then some held
            for s in range(1, k):
                pool.give_sub(b, s)
            if i % 3 == 1:
                m.arena.reach(pool.key, b, pool.phys[b], [k - 1])
            elif i % 3 == 2:
                m.arena.reach(pool.key, b, pool.phys[b], [1])
        subs = [range(1, k) if as_range else list(range(1, k)) for _ in blocks]
        taken = m.arena.reach_run(pool.key, blocks, [pool.phys[b] for b in blocks], subs)
        states.append((taken, _arena_state(m.arena)))
        m.check_invariants()
    assert states[0] == states[1] and states[0][0] == 12 * (k - 1) - 8


def test_taking_more_pages_than_are_free_raises_and_changes_nothing():
    """The page run primitive refuses a take the free list cannot cover (admission reserves
    pages first; a caller that did not is a bug), before any page changes owner."""
    arena = Arena(4, 4096, device="meta")
    pk = ("comp", "g")
    arena.pages_held[pk] = 0
    assert arena._own_tops(pk, [0, 1]) == [0, 1]
    before = _arena_state(arena)
    with pytest.raises(InvariantViolation):
        arena._own_tops(pk, [2, 3, 4])
    assert _arena_state(arena) == before
    assert arena._own_tops(pk, [2, 3]) == [2, 3] and arena.n_free == 0
