"""What an engine outside hybridkv needs to mirror the cache (vLLM's worker and KV events):
``Allocation.copies`` names every snapshot copy a hit's first allocation made (source slot ->
destination slot per pool, slots of ``tables()``), and ``CacheManager(events=True)`` feeds a
CacheEvent for every block filed in / taken out of the prefix index (``take_events``)."""
from hybridkv.cache import CacheManager
from hybridkv.cache.request import CacheEvent
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
