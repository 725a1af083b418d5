"""CacheManager on the v4-mini layout: hits, fallbacks, every 'hash hit but state incomplete'
case through the public API, eviction per kind, drafts, bad input, metrics."""
import pytest

from hybridkv.errors import (AdmissionRefused, BadArgument, BadSalt, BadTokens,
                             CommitPastAllocation, RequestBusy, UnknownRequest, LayoutError)
from hybridkv.layout import LayerGroup, ModelLayout
from hybridkv.manager import CacheManager
from hybridkv.tables import TransitionRefused
from spec.common import FREE, READY

LAY = ModelLayout.v4_mini()


def mk(n=48, **kw):
    kw.setdefault("checked", True)
    return CacheManager(LAY, num_blocks=n, **kw)


def run(m, rid, tokens, salt=b"", decode=()):
    """lookup + allocate + commit + (decode steps) + free; returns the plan."""
    plan = m.lookup(rid, tokens, salt=salt)
    m.allocate(rid, len(tokens) - plan.reuse_tokens)
    m.commit(rid, len(tokens) - plan.reuse_tokens)
    m.begin_read(rid)
    for t in decode:
        m.allocate(rid, 1)
        m.commit(rid, 1, [t])
    m.free(rid)
    return plan


def snapshot(m):
    pols = {pk: (p.clock, {k: (e.prio, e.uses, e.seq) for k, e in p._e.items()})
            for pk, p in m.policies.items()}
    return ({pk: (tuple(p.recs), tuple(p.phys), p.n_free, tuple(p.abi_of))
             for pk, p in m.pools.items()},
            {pk: dict(d) for pk, d in m.index.objs.items()}, dict(m.index.ckpts),
            {pk: set(s) for pk, s in m.evictable.items()}, pols,
            {r: (q.phase, q.L, q.A, q.D, tuple(q.reads), tuple(q.own), tuple(q.tokens))
             for r, q in m.reqs.items()}, m.miv)


def published(m, kind, group, H, tokens, salt=b""):
    """Block of the ``ckpt`` object of (kind, group) at H for this prompt."""
    from hybridkv.index import extend_chain, obj_key, root_key
    keys = extend_chain([], root_key(LAY, salt), tokens, LAY.granule)
    return m.index.get(kind, group, obj_key(keys[H // LAY.granule - 1], group, b"ckpt"))


P40 = [(7 * i + 3) % 250 for i in range(40)]


def test_layout_alignment_and_warning():
    assert (LAY.granule, LAY.lcm, LAY.hit_alignment) == (2, 96, 2)
    with pytest.warns(UserWarning, match="LCM"):
        ModelLayout([LayerGroup("a", "swa", (0,), 509, 8), LayerGroup("b", "swa", (1,), 512, 8)])
    with pytest.raises(LayoutError) as e:
        ModelLayout([LayerGroup("a", "csa", (0,), 10, 8, 4, 4)])
    assert e.value.value == (10, 4)


def test_hit_after_request_end_and_per_group_lengths():
    m = mk()
    assert run(m, "a", P40).reuse_tokens == 0
    plan = run(m, "b", P40 + [1, 2, 3])
    assert plan.reuse_tokens == 40 and plan.outcome == "hit"
    assert plan.group_hits == {"swa": 40, "csa": 40, "hca": 40}
    assert {r.ref.kind for r in plan.reads} == {"comp", "tail", "swa", "idx"}
    # the same prompt again: at least one token is left to compute
    p = m.lookup("c", P40)
    assert p.reuse_tokens < 40


def test_in_flight_writer_is_a_hash_hit_but_never_reused():
    m = mk()
    run(m, "a", P40[:20])
    m.lookup("w", P40)
    m.allocate("w", 20)                      # checkpoint at 40 published, objects writing
    plan = m.lookup("r", P40 + [5])
    assert plan.reuse_tokens == 20 and plan.outcome == "partial"
    rej = plan.rejections[0]
    assert (rej.H, rej.layer, rej.check) == (40, 3, "readable")
    m.commit("w", 20)
    assert m.lookup("r", P40 + [5]).reuse_tokens == 40


def _incomplete(m, case):
    """Break one object of the checkpoint at 40; the lookup must fall back."""
    if case == "window_slid":
        m.pools[("swa", "csa")].fire(published(m, "swa", "csa", 40, P40), "slide")
    elif case == "indexer_stale":
        m.bump_indexer_version(sweep=False)   # outdated objects still in place (not swept)
    elif case == "disk_in_flight":
        pool, b = m.pools[("tail", "hca")], published(m, "tail", "hca", 40, P40)
        from hybridkv import alloc
        from hybridkv.pools import ObjRef
        key = m.index.key_of[("tail", "hca")][b]
        alloc.drop(m, ObjRef("tail", "hca", b))
        pool.fire(b, "load_start")           # reloading from disk, copy not yet verified
        m.index.put("tail", "hca", key, b)
    elif case == "abi_mismatch":
        m.set_kernel_version("comp", "hca", 2)
    elif case == "misaligned":
        from hybridkv import alloc
        from hybridkv.pools import ObjRef
        alloc.drop(m, ObjRef("comp", "hca", published(m, "comp", "hca", 40, P40)))


@pytest.mark.parametrize("case,layer,check", [("window_slid", 3, "covers"),
                                              ("indexer_stale", 3, "covers"),
                                              ("disk_in_flight", 3, "readable"),
                                              ("abi_mismatch", 2, "abi"),
                                              ("misaligned", 1, "aligned")])
def test_hash_hit_incomplete_state_never_reused(case, layer, check):
    m = mk(every_n=16)                        # checkpoints at 16, 32 and the end (40)
    run(m, "a", P40)
    assert m.lookup("x", P40 + [9]).reuse_tokens == 40
    m.free("x")
    _incomplete(m, case)
    plan = m.lookup("b", P40 + [9])
    assert plan.reuse_tokens < 40
    first = plan.rejections[0]
    assert (first.H, first.layer, first.check) == (40, layer, check), plan.rejections
    if case not in ("indexer_stale", "abi_mismatch"):
        assert plan.reuse_tokens == 32        # falls back to the largest valid H'
    m.check_invariants()


def test_evicting_the_window_shrinks_the_hit():
    m = mk(every_n=16)
    run(m, "a", P40)
    from hybridkv import alloc
    from hybridkv.pools import ObjRef
    alloc.drop(m, ObjRef("swa", "swa", published(m, "swa", "swa", 40, P40)))
    assert m.lookup("b", P40 + [1]).reuse_tokens == 32
    alloc.drop(m, ObjRef("swa", "swa", published(m, "swa", "swa", 32, P40)))
    assert m.lookup("b", P40 + [1]).reuse_tokens == 16


def test_salts_isolate_tenants_in_every_group():
    m = mk()
    run(m, "a", P40, salt=b"t1")
    assert m.lookup("b", P40 + [1], salt=b"t2").reuse_tokens == 0
    assert m.lookup("b", P40 + [1], salt=b"t1").reuse_tokens == 40
    for g in ("swa", "csa", "hca"):
        assert published(m, "swa", g, 40, P40, b"t1") is not None
        assert published(m, "swa", g, 40, P40, b"t2") is None


def test_lookup_not_taken_changes_nothing():
    m = mk()
    run(m, "a", P40)
    before = snapshot(m)
    m.lookup("b", P40 + [1])
    m.free("b")
    assert snapshot(m) == before


def test_failed_allocation_changes_nothing_and_hits_survive():
    m = mk(n=12)
    run(m, "a", P40)
    m.lookup("b", P40 + [1])
    before = snapshot(m)
    m.lookup("big", list(range(200)))
    before_big = snapshot(m)
    with pytest.raises(AdmissionRefused) as e:
        m.allocate("big", 200)
    assert e.value.value and snapshot(m) == before_big
    m.free("big")
    assert snapshot(m) == before
    assert m.lookup("b", P40 + [1]).reuse_tokens == 40


def test_swa_churn_does_not_flush_other_prefixes():
    """A long decode frees window snapshots every few tokens; they go back to the free list
    and never push another request's cached checkpoint out."""
    sizes = {pk: (3 if pk[0] == "swa" else 48) for pk in LAY.pool_keys()}
    m = CacheManager(LAY, num_blocks=sizes)
    run(m, "a", P40)
    run(m, "b", [1, 2, 3, 4], decode=[(5 * i) % 200 for i in range(120)])
    m.check_invariants()
    churn = m.metrics.transitions[("swa", READY, FREE)]
    assert churn > 50 and not m.metrics.evictions.get("swa")
    assert m.lookup("c", P40 + [7]).reuse_tokens == 40


def test_drafts_never_published_and_reject_rolls_back():
    m = mk()
    run(m, "a", P40[:20])
    m.lookup("d", P40[:30])
    m.allocate("d", 10)
    m.commit("d", 10)
    keep = snapshot(m)[1]
    m.allocate("d", 0, num_draft_tokens=6)
    assert snapshot(m)[1] == keep                       # nothing draft in the index
    assert m.lookup("o", P40[:38]).reuse_tokens <= 30
    m.free("o")
    m.reject_drafts("d")
    assert snapshot(m)[1] == keep
    live = {pk: sum(r.st != FREE for r in p.recs) for pk, p in m.pools.items()}
    m.allocate("d", 0, num_draft_tokens=4)
    m.accept_drafts("d", P40[30:33])
    assert m.reqs["d"].L == 33
    m.free("d")
    assert live and m.lookup("e", P40[:33] + [1]).reuse_tokens == 32


@pytest.mark.parametrize("call,exc,value", [
    (lambda m: m.allocate("nope", 3), UnknownRequest, "nope"),
    (lambda m: m.lookup("b", [1, -2, 3]), BadTokens, (1, -2)),
    (lambda m: m.lookup("b", [1, 256]), BadTokens, (1, 256)),
    (lambda m: m.lookup("b", [1, 2], salt="t"), BadSalt, "str"),
    (lambda m: m.commit("p", 99), CommitPastAllocation, (99, 4)),
    (lambda m: m.allocate("p", -1), BadArgument, -1),
    (lambda m: m.allocate("p", True), BadArgument, True),
    (lambda m: m.lookup("p", [1, 2]), RequestBusy, "p"),
    (lambda m: m.commit("p", 4, [1, 2, 3]), BadTokens, (3, 4)),
])
def test_bad_input_named_error_and_nothing_changed(call, exc, value):
    m = mk()
    run(m, "a", P40)
    m.lookup("p", P40[:10])
    m.allocate("p", 4)
    before = snapshot(m)
    with pytest.raises(exc) as e:
        call(m)
    assert e.value.value == value
    assert snapshot(m) == before


def test_toctou_relocated_object_refreshes_plan_and_pinned_cannot_move():
    m = mk()
    run(m, "a", P40)
    plan = m.lookup("b", P40 + [1])
    tail = next(r for r in plan.reads if r.ref.kind == "tail")
    pool = m.pools[("tail", tail.ref.group)]
    pool.relocate(tail.ref.block)                 # moved after the lookup checked it
    m.allocate("b", 1)
    new = next(r for r in m.reqs["b"].reads if r.ref == tail.ref)
    assert new.ep == tail.ep + 1                 # the plan was re-validated, not trusted
    with pytest.raises(TransitionRefused):
        pool.relocate(tail.ref.block)            # pinned: no relocation
    m.begin_read("b")
    m.free("b")


def test_metrics_prometheus_text():
    m = mk(checked=False)
    run(m, "a", P40)
    run(m, "b", P40 + [1])
    text = m.metrics_text()
    assert 'hybridkv_transitions_total{from_state="writing",kind="tail",to_state="ready"}' in text
    assert 'hybridkv_lookups_total{outcome="hit",reason="ok"} 1.0' in text
    assert 'hybridkv_group_hit_tokens_total{group="csa"} 40.0' in text
    s = m.stats()
    assert (s["hit"], s["miss"]) == (1, 1)
    assert s["pools"]["tail/csa"]["ready"] >= 1 and s["pools"]["tail/csa"]["pinned"] == 0


def test_pool_integrity_detects_corruption():
    m = mk(checked=False)
    run(m, "a", P40)
    pool = m.pools[("comp", "csa")]
    assert pool.check_integrity() == []
    b = next(i for i, r in enumerate(pool.recs) if r.st == READY)
    pool.recs[b] = pool.recs[b]._replace(pins=1)
    assert pool.check_integrity()


def test_checked_mode_raises_on_a_broken_invariant():
    from hybridkv.errors import InvariantViolation
    m = mk()
    run(m, "a", P40)
    pool = m.pools[("tail", "csa")]
    b = next(i for i, r in enumerate(pool.recs) if r.st == READY)
    pool.recs[b] = pool.recs[b]._replace(rows=0)        # a published tail that lost rows
    with pytest.raises(InvariantViolation) as e:      # the full sweep (an untouched block:
        m.check_invariants()                          # see tests/test_runtime_checked.py)
    assert e.value.value in ("published_complete", "pool_integrity")
