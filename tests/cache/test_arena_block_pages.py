"""Arena blocks of several pages (``CacheManager(num_pages=N, block_pages={pool: k})``): an
engine with one id per page-sized unit (vLLM: a window page spans W'/block_size KV block ids)
gets up to k distinct pages per block of that pool: its slot when it leaves FREE, the other
sub-pages as the request's positions reach them, given back as the window slides past them,
every one through the spec's guards; admission and ``available_blocks`` count pages; the
invariants hold and the capacity comes back whole under a random run."""
import random

import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache.arena import NO_PAGE
from hybridkv.errors import AdmissionRefused, BadArgument, InvariantViolation
from hybridkv.layout import LayerGroup, ModelLayout
from spec.common import FREE
from tests.cache.helpers import commit_all

BS, W = 4, 12                                       # a window page spans 3 blocks of 4 tokens
LAY = ModelLayout([LayerGroup("g0", "full", (0,), BS, 0, head_dim=1),
                   LayerGroup("g1", "swa", (1,), BS, W, head_dim=1)], name="pages")
K = {("swa", "g1"): W // BS}


def mk(pages, block_pages=K, **kw):
    return CacheManager(LAY, num_pages=pages, device="meta", checked=True,
                        block_pages=block_pages, **kw)


def held(m):
    """page -> pool key of every page a non-FREE block holds (each page once)."""
    out = {}
    for pk, pool in m.pools.items():
        for b, rec in enumerate(pool.recs):
            if rec.st != FREE:
                for page in m.arena.held_pages(pool.slot(b)):
                    assert page not in out, ("page held twice", page)
                    out[page] = pk
    return out


def window_pages(m, rid):
    """The request's live window pages: slot -> its sub-pages (NO_PAGE where none)."""
    return {s: m.slot_pages(s) for s in m.tables(rid)["g1"].swa if s >= 0}


def test_a_window_block_takes_sub_pages_as_positions_reach_them_and_slides_them_back():
    m = mk(64)
    m.lookup("a", list(range(30)))
    m.allocate("a", 1)                                # position 0: page 0's slot only
    (slot, subs), = window_pages(m, "a").items()
    assert subs[0] == slot and subs[1:] == [NO_PAGE, NO_PAGE]
    m.commit("a", 1)
    m.allocate("a", 5)                                # [1, 6): sub-page 1 too
    assert m.slot_pages(slot)[1] != NO_PAGE and m.slot_pages(slot)[2] == NO_PAGE
    m.commit("a", 5)
    m.allocate("a", 8)                                # [6, 14): sub-page 2, page 1's slot
    assert sorted(len(m.arena.held_pages(s)) for s in window_pages(m, "a")) == [1, 3]
    m.check_invariants()
    m.commit("a", 8)
    m.allocate("a", 10)                               # [14, 24)
    m.commit("a", 5)                                  # settled 19: 19 - W + 1 = 8
    sub2 = m.slot_pages(slot)[2]
    assert m.slot_pages(slot) == [slot, NO_PAGE, sub2] and sub2 != NO_PAGE   # [4, 8) back
    m.commit("a", 1)                                  # 20 - 11 = 9: sub-page 2 still read
    assert m.slot_pages(slot)[2] != NO_PAGE
    m.commit("a", 3)                                  # 23 - 11 = 12: page 0 given back
    assert slot not in window_pages(m, "a")
    m.check_invariants()
    m.free("a")
    m.check_invariants()
    assert m.available_blocks()[("comp", "g0")] == 64


def test_admission_counts_only_the_pages_needed_now():
    m = mk(2)                                         # k = 3 > 2 pages: still a cache
    m.lookup("a", [5, 6, 7])
    assert m.pages_needed("a", 2) == {("comp", "g0"): 1, ("swa", "g1"): 1}
    m.allocate("a", 2)                                # 2 pages: a block and a window slot
    assert len(held(m)) == 2 and m.arena.n_free == 0
    m.check_invariants()
    before = (m.available_blocks(), m.stats()["pools"], list(m.arena.free),
              {s: list(p) for s, p in m.arena.more_pages.items()})
    with pytest.raises(AdmissionRefused) as err:
        m.allocate("a", 3)                            # [2, 5): a block and sub-page 1 more
    total, avail = err.value.value["arena"]
    assert total >= 2 and avail == 0
    assert before == (m.available_blocks(), m.stats()["pools"], list(m.arena.free),
                      {s: list(p) for s, p in m.arena.more_pages.items()})
    m.check_invariants()


def test_a_sub_page_give_or_take_by_a_non_owner_is_refused_and_changes_nothing():
    m = mk(16)
    m.lookup("a", list(range(8)))
    m.lookup("b", list(range(100, 108)))
    m.allocate("a", 6)
    m.allocate("b", 6)
    pool = m.pools[("swa", "g1")]
    (slot, subs), = window_pages(m, "a").items()
    (other, _), = window_pages(m, "b").items()
    owner = m.arena.owner_of(slot)
    state = lambda: (bytes(m.arena.page_state), list(m.arena.owner),  # noqa: E731
                     list(m.arena.owner_block), list(m.arena.free),
                     {s: list(p) for s, p in m.arena.more_pages.items()})
    before = state()
    wrong = [(("swa", "g1"), m.arena.owner_of(other)[2]), (("comp", "g0"), owner[2])]
    for pk, block in wrong:
        with pytest.raises(InvariantViolation):
            m.arena.give_sub(pk, block, slot, 1)
        with pytest.raises(InvariantViolation):
            m.arena.reach(pk, block, slot, [2])
        assert state() == before
    with pytest.raises(BadArgument):
        pool.give_sub(owner[2], 3)                    # sub-pages are 1..k-1
    assert state() == before
    assert pool.give_sub(owner[2], 1) and m.slot_pages(slot)[1] == NO_PAGE
    m.check_invariants()


def test_a_block_giving_back_a_page_it_does_not_own_is_refused_and_changes_nothing():
    """A k-page block's give asks ``can_give`` once when every page has one owner: a give
    naming another block's sub-page (mixed owners) or one by a block that owns none of them
    (one owner, the wrong one) is still refused, and nothing changes."""
    m = mk(16)
    m.lookup("a", list(range(8)))
    m.lookup("b", list(range(100, 108)))
    m.allocate("a", 6)
    m.allocate("b", 6)
    pk = ("swa", "g1")
    (slot, subs), = window_pages(m, "a").items()
    (other, other_subs), = window_pages(m, "b").items()
    assert subs[1] != NO_PAGE and other_subs[1] != NO_PAGE
    a_block, b_block = m.arena.owner_of(slot)[2], m.arena.owner_of(other)[2]
    state = lambda: (bytes(m.arena.page_state), list(m.arena.owner),  # noqa: E731
                     list(m.arena.owner_block), list(m.arena.free),
                     {s: list(p) for s, p in m.arena.more_pages.items()}, dict(m.arena.pages_held))
    before = state()
    with pytest.raises(InvariantViolation):             # one owner (a), given by b
        m.arena.give(pk, b_block, slot)
    with pytest.raises(InvariantViolation):
        m.arena.check_give(pk, b_block, slot)
    assert state() == before
    m.arena.more_pages[slot][0] = other_subs[1]         # a's bookkeeping names b's page
    mixed = state()
    with pytest.raises(InvariantViolation):
        m.arena.give(pk, a_block, slot)
    with pytest.raises(InvariantViolation):
        m.arena.check_give(pk, a_block, slot)
    assert state() == mixed
    m.arena.more_pages[slot][0] = subs[1]
    assert state() == before
    m.check_invariants()


def test_check_catches_a_leaked_sub_page():
    m = mk(16)
    m.lookup("a", list(range(8)))
    m.allocate("a", 6)
    (slot, subs), = window_pages(m, "a").items()
    assert m.arena.check(m.pools) == []
    m.arena.more_pages[slot][0] = NO_PAGE             # the block forgets a page it owns
    bad = m.arena.check(m.pools)
    assert {b[0] for b in bad} >= {"page-owner", "page-leaked"}
    with pytest.raises(InvariantViolation):
        m.check_invariants()
    m.arena.more_pages[slot][0] = subs[1]
    assert m.arena.check(m.pools) == []


def test_bad_block_pages_are_refused():
    with pytest.raises(BadArgument) as err:
        mk(16, block_pages={("swa", "nope"): 2})
    assert err.value.value == {("swa", "nope"): 2}
    with pytest.raises(BadArgument):
        mk(16, block_pages={("swa", "g1"): 0})
    assert mk(2, block_pages={("swa", "g1"): 40}).arena.pages_per_block(("swa", "g1")) == 40
    with pytest.raises(BadArgument):
        CacheManager(LAY, num_blocks=16, device="meta", block_pages=K)


def test_a_random_run_keeps_the_invariants_and_gives_every_page_back():
    rng = random.Random(7)
    m, live = mk(48), []
    prompts = [[rng.randrange(6) for _ in range(rng.randrange(5, 40))] for _ in range(12)]
    for step in range(60):
        if live and (rng.random() < 0.4 or len(live) > 3):
            m.free(live.pop(rng.randrange(len(live))))
        else:
            rid, toks = f"r{step}", rng.choice(prompts) + [step % 6]
            plan = m.lookup(rid, toks)
            try:
                commit_all(m, rid, m.allocate(rid, len(toks) - plan.reuse_tokens))
                live.append(rid)
            except AdmissionRefused:
                m.free(rid)
        m.check_invariants()
    for rid in live:
        m.free(rid)
    m.check_invariants()
    assert m.available_blocks()[("comp", "g0")] == 48       # evictable + free: every page


def test_the_spec_page_rule_lets_a_held_block_own_one_to_k_pages():
    from spec.arena import block_pages_ok
    from spec.common import READY
    assert block_pages_ok(READY, 3, 3) and block_pages_ok(READY, 1, 3)
    assert block_pages_ok(FREE, 0, 3)
    assert not block_pages_ok(READY, 0, 3) and not block_pages_ok(READY, 4, 3)
    assert not block_pages_ok(FREE, 1, 3) and not block_pages_ok(FREE, 3, 3)


@pytest.mark.parametrize("every_n", [4, 8, 12])
@pytest.mark.parametrize("first,step", [(3, 9), (8, 16), (13, 30)])
def test_an_allocation_takes_exactly_the_pages_admission_counted(every_n, first, step):
    """Admission's closed-form sizes (``pages_needed``, with each retention point's snapshots:
    ``Snapshots.count`` blocks and ``WindowSubPages.count_snapshots`` sub-pages) are what the
    allocation then takes from the arena, page for page, at every window position: an
    under-count would let the arena run short after admission, an over-count refuses what
    fits."""
    m = mk(512, every_n=every_n)
    m.lookup("a", list(range(200)))
    start = 0
    for n in (first, step, step, 1, step):
        req = m.requests["a"]
        points = m.snapshots.points(req, start, start + n)
        counted = sum(m.pages_needed("a", n).values()) + \
            sum(m.snapshots.count(points).values()) + \
            sum(m.subpages.count_snapshots(points).values())
        free = m.arena.n_free
        m.allocate("a", n)
        assert free - m.arena.n_free == counted, (start, n, sorted(points))
        m.commit("a", n)
        start += n
    m.check_invariants()


def test_held_pages_are_the_block_pages_it_holds_for_every_slot():
    """``held_pages`` (a one-page slot answered without building its sub-page list) is
    ``pages_of`` less NO_PAGE for every slot: a one-page block's, a window block's with some
    sub-pages taken, a free page's own id, and NO_PAGE (a FREE block's slot: none)."""
    m = mk(64)
    m.lookup("a", list(range(30)))
    m.allocate("a", 6)
    a = m.arena
    assert a.held_pages(NO_PAGE) == []
    for page in range(a.num_pages):
        assert a.held_pages(page) == [p for p in a.pages_of(page) if p != NO_PAGE], page
    slots = list(window_pages(m, "a"))
    assert slots and any(len(a.held_pages(s)) > 1 for s in slots)
    m.commit("a", 6)
    m.free("a")
    m.check_invariants()
