"""What an engine outside hybridkv needs to mirror the cache (vLLM's worker and KV events):
``Allocation.copies`` names every snapshot copy a hit's first allocation made (source slot ->
destination slot per pool, slots of ``tables()``), ``commit`` returns the copies of the
snapshots it captured (``SlotCopy``) and, with ``settled_tokens``, keeps the window an in-flight
step still reads; ``CacheManager(events=True)`` feeds a CacheEvent for every block filed in /
taken out of the prefix index (``take_events``), ``cached_block`` / ``slot`` name the block a
key is cached under."""
import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache.pool import ObjRef
from hybridkv.cache.request import CacheEvent, SlotCopy
from hybridkv.errors import BadArgument
from hybridkv.layout import LayerGroup, ModelLayout

LAY = ModelLayout([LayerGroup("g0", "full", (0,), 4, 0, head_dim=1),
                   LayerGroup("g1", "swa", (1,), 4, 8, head_dim=1)], name="feeds")
P = list(range(100, 120))


def mk(pages=24, **kw):
    return CacheManager(LAY, num_pages=pages, device="meta", checked=True, **kw)


def prefill(m, rid, tokens):
    plan = m.lookup(rid, tokens)
    got = m.allocate(rid, len(tokens) - plan.reuse_tokens)
    m.commit(rid, len(tokens) - plan.reuse_tokens, tokens[plan.reuse_tokens:])
    return plan.reuse_tokens, got


def test_a_cold_allocation_copies_nothing():
    m = mk()
    H, got = prefill(m, "a", P)
    assert H == 0 and got.copies == () and got.copied_bytes == 0


def test_a_hit_names_its_window_restore():
    m = mk()
    prefill(m, "a", P)
    m.free("a")
    H = m.lookup("b", P + [1, 2, 3, 4, 5]).reuse_tokens
    got = m.allocate("b", 25 - H)
    assert H > 0 and got.copies and got.copied_bytes > 0
    swa = m.tables("b")["g1"].swa                        # before a commit slides the window
    for kind, group, src, dst in got.copies:
        assert (kind, group) == ("swa", "g1")
        assert dst in swa and src not in swa          # into the request's own page
    assert len({dst for *_, dst in got.copies}) == len(got.copies)
    assert m.allocate("b", 1).copies == ()           # only the first allocation restores


def test_events_are_off_by_default():
    m = mk()
    prefill(m, "a", P)
    assert m.take_events() == []


def test_stored_events_chain_their_parents_and_drain():
    m = mk(events=True)
    prefill(m, "a", P)
    ev = m.take_events()
    assert ev and all(isinstance(e, CacheEvent) for e in ev)
    assert all(e.request_id == "a" for e in ev if e.stored)
    gone = [(e.kind, e.key) for e in ev if not e.stored]   # a superseded window snapshot
    assert set(gone) <= {(e.kind, e.key) for e in ev if e.stored}
    chain = [e for e in ev if (e.kind, e.exact) == ("comp", False)]
    assert [e.at for e in chain] == [4, 8, 12, 16, 20]
    assert chain[0].parent is None
    assert all(b.parent == a.key for a, b in zip(chain, chain[1:]))
    assert any(e.kind == "swa" and e.exact for e in ev)    # the window snapshot
    assert m.take_events() == []


def test_eviction_reports_every_removed_block_once():
    m = mk(pages=12, events=True)
    prefill(m, "a", P)
    m.free("a")
    stored = {(e.kind, e.key) for e in m.take_events() if e.stored}
    prefill(m, "b", list(range(200, 220)))              # no room without evicting a's
    ev = m.take_events()
    stored |= {(e.kind, e.key) for e in ev if e.stored}
    removed = [(e.kind, e.key) for e in ev if not e.stored]
    assert removed and len(set(removed)) == len(removed) and set(removed) <= stored
    assert all(e.at is None and e.request_id is None for e in ev if not e.stored)
    assert [e.request_id for e in ev if e.stored] and \
        {e.request_id for e in ev if e.stored} == {"b"}


def test_a_commit_ending_on_a_checkpoint_returns_its_capture_copies():
    m = mk()
    m.lookup("a", P)
    got = m.allocate("a", 20)
    assert 16 in got.checkpoints                       # the prompt's repeat point
    assert m.commit("a", 15, P[:15]) == ()              # passes no checkpoint
    copies = m.commit("a", 1, P[15:16])                 # ends on 16: captures the window
    pages = m.tables("a")["g1"].swa
    assert copies and all(isinstance(c, SlotCopy) for c in copies)
    assert {(c.kind, c.group) for c in copies} == {("swa", "g1")}
    assert {c.src for c in copies} <= set(pages)       # from the request's window pages
    (dst,) = {c.dst for c in copies}
    assert dst not in pages                             # into the snapshot's own page
    assert sorted((c.row_start, c.row_end) for c in copies) == [(0, None)]   # one page
    assert m.commit("a", 3, P[16:19]) == ()
    wrap = m.commit("a", 1, P[19:])                     # the end point 20: rows of two pages
    assert sorted((c.row_start, c.row_end) for c in wrap) == [(0, 4), (4, 8)]
    assert len({c.src for c in wrap}) == 2 and len({c.dst for c in wrap}) == 1


def test_settled_tokens_keep_the_window_an_in_flight_step_reads():
    m = mk()
    m.lookup("a", P)
    m.allocate("a", 20)
    m.commit("a", 20, P, settled_tokens=0)              # a step committed before it runs
    assert -1 not in m.tables("a")["g1"].swa            # every page it reads is still held
    m.commit("a", 0, None, settled_tokens=20)           # it ran: the window slides
    assert m.tables("a")["g1"].swa[0] == -1
    m.check_invariants()


def test_settled_tokens_past_the_commit_are_refused_and_change_nothing():
    m = mk()
    m.lookup("a", P)
    m.allocate("a", 20)
    m.commit("a", 8, P[:8], settled_tokens=0)
    before = (list(m.tables("a")["g1"].swa), m.stats()["pools"])
    with pytest.raises(BadArgument) as err:
        m.commit("a", 4, P[8:12], settled_tokens=13)
    assert err.value.value == (13, 12)
    assert (list(m.tables("a")["g1"].swa), m.stats()["pools"]) == before
    assert m.commit("a", 4, P[8:12], settled_tokens=12) == ()


def test_cached_block_names_the_slot_a_key_is_cached_under():
    m = mk(events=True)
    prefill(m, "a", P)
    stored = [e for e in m.take_events() if e.stored]
    chain = [e for e in stored if e.kind == "comp"]
    ref = m.cached_block("comp", "g0", chain[0].key)
    assert isinstance(ref, ObjRef) and m.slot(ref) == m.tables("a")["g0"].comp[0]
    snap = [e for e in stored if e.exact]
    assert snap and m.cached_block("swa", "g1", snap[-1].key, exact=True) is not None
    assert m.cached_block("comp", "g0", b"no such key") is None
    with pytest.raises(BadArgument):
        m.slot(ObjRef("comp", "g0", 10 ** 6))


def test_hit_slots_are_the_slots_of_a_plan_s_chain_reads_pool_by_pool():
    """A hit's block table at once (an engine names the hit's blocks before its first
    allocation): each pool's chain reads' slots in the plan's order, as ``slot`` names each;
    the exact objects (restored into fresh blocks) are not in it."""
    m = mk()
    prefill(m, "a", P)
    m.free("a")
    plan = m.lookup("b", P + [1, 2, 3])
    assert plan.reuse_tokens and any(r.exact for r in plan.reads)
    want = {}
    for r in plan.reads:
        if not r.exact:
            want.setdefault((r.ref.kind, r.ref.group), []).append(m.slot(r.ref))
    assert m.hit_slots(plan) == want and want
    m.allocate("b", 3)
    assert m.hit_slots(plan)[("comp", "g0")] == \
        m.tables("b")["g0"].comp[:len(want[("comp", "g0")])]
    with pytest.raises(BadArgument):
        m.hit_slots(plan.reads)
