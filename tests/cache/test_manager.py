"""CacheManager on the v4-mini layout: hits, fallbacks, every 'hash hit but state incomplete'
case, eviction per kind, drafts, bad input, TOCTOU, metrics."""
import pytest

from hybridkv.cache import CacheManager, ObjRef
from hybridkv.errors import (AdmissionRefused, BadArgument, BadSalt, BadTokens,
                             CommitPastAllocation, InvariantViolation, Refused, RequestBusy,
                             StaleRead, UnknownRequest)
from spec.common import FREE, READY, WRITING
from tests.cache.helpers import (LAY, P40, commit_all, exact_block, fingerprint, mk, run)


def test_hit_after_request_end_and_per_group_lengths():
    m = mk()
    assert run(m, "a", P40).reuse_tokens == 0
    plan = run(m, "b", P40 + [1, 2, 3])
    assert plan.reuse_tokens == 40 and plan.outcome == "hit"
    assert plan.group_hits == {"swa": 40, "csa": 40, "hca": 40}
    assert {r.ref.kind for r in plan.reads} == {"comp", "tail", "swa", "idx"}
    m.check_invariants()


def test_identical_prompt_hits_on_its_first_repeat():
    """An identical prompt resumes at the last aligned position before its last token: the
    first request retains a checkpoint there (issue 14, item 7)."""
    m = mk()
    run(m, "a", P40)
    plan = run(m, "b", P40)
    assert plan.reuse_tokens == 38 and plan.outcome == "hit"


def test_in_flight_writer_is_a_hash_hit_but_never_reused():
    m = mk()
    run(m, "a", P40[:20])
    m.lookup("w", P40)
    a = m.allocate("w", 20)                  # checkpoints at 38 and 40 published, writing
    plan = m.lookup("r", P40 + [5])
    assert plan.reuse_tokens == 20 and plan.outcome == "partial"
    rej = plan.rejections[0]
    assert (rej.H, rej.layer, rej.check) == (40, 3, "readable")
    commit_all(m, "w", a)
    assert m.lookup("r", P40 + [5]).reuse_tokens == 40


def _incomplete(m, case):
    """Break one object of the checkpoint at 40; the lookup must fall back."""
    if case == "window_slid":
        m.pools[("swa", "csa")].fire(exact_block(m, "swa", "csa", 40, P40), "slide")
    elif case == "indexer_stale":
        m.bump_indexer_version(sweep=False)   # outdated objects still in place (not swept)
    elif case == "abi_mismatch":
        m.set_kernel_version("comp", "hca", 2)
    elif case == "misaligned":               # 40 is off csa's 16-token block: needs its copy
        m.evictor.drop(ObjRef("comp", "csa", exact_block(m, "comp", "csa", 40, P40)))
        assert m.lookup("x", P40 + [9]).candidates[0] == 38     # the record at 40 died
        m.free("x")
        assert all(b in m.evictor.dead[("swa", g)] for g in ("swa", "csa", "hca")
                   for b in [exact_block(m, "swa", g, 40, P40)])
        from hybridkv.cache.index import extend_chain, root_key
        key = extend_chain([], root_key(LAY, b""), P40, LAY.granule)[19]
        anchors = [ObjRef(k, g, m.index.chain_block(k, g, extend_chain(
            [], root_key(LAY, b""), P40, LAY.granule)[15])) for k, g in (("comp", "csa"),
                                                                         ("idx", "csa"))]
        anchors.append(ObjRef("comp", "hca", m.index.chain_block("comp", "hca", extend_chain(
            [], root_key(LAY, b""), P40, LAY.granule)[15])))
        m.index.add_checkpoint(40, key, anchors)    # a record whose off-block copy is gone


@pytest.mark.parametrize("case,layer,check", [("window_slid", 3, "covers"),
                                              ("indexer_stale", 3, "covers"),
                                              ("abi_mismatch", 2, "abi"),
                                              ("misaligned", 1, "aligned")])
def test_hash_hit_incomplete_state_never_reused(case, layer, check):
    m = mk(every_n=16)                        # checkpoints at 16, 32, 38 and the end (40)
    run(m, "a", P40)
    assert m.lookup("x", P40 + [9]).reuse_tokens == 40
    m.free("x")
    _incomplete(m, case)
    plan = m.lookup("b", P40 + [9])
    assert plan.reuse_tokens < 40
    first = plan.rejections[0]
    assert (first.H, first.layer, first.check) == (40, layer, check), plan.rejections
    if case in ("window_slid", "misaligned"):
        assert plan.reuse_tokens == 38        # falls back to the largest valid H'
    if case != "misaligned":                  # (its record was forged by the test)
        m.check_invariants()


def test_evicting_the_window_shrinks_the_hit():
    m = mk(every_n=16)
    run(m, "a", P40)
    for H, then in ((40, 38), (38, 32), (32, 16)):
        m.evictor.drop(ObjRef("swa", "swa", exact_block(m, "swa", "swa", H, P40)))
        assert m.lookup("b", P40 + [1]).reuse_tokens == then
    m.check_invariants()


def test_salts_isolate_tenants_in_every_group():
    m = mk()
    run(m, "a", P40, salt=b"t1")
    assert m.lookup("b", P40 + [1], salt=b"t2").reuse_tokens == 0
    assert m.lookup("b", P40 + [1], salt=b"t1").reuse_tokens == 40
    for g in ("swa", "csa", "hca"):
        assert exact_block(m, "swa", g, 40, P40, b"t1") is not None
        assert exact_block(m, "swa", g, 40, P40, b"t2") is None


def test_lookup_not_taken_changes_nothing():
    m = mk()
    run(m, "a", P40)
    before = fingerprint(m)
    m.lookup("b", P40 + [1])
    m.free("b")
    assert fingerprint(m) == before


def test_failed_allocation_changes_nothing_and_hits_survive():
    m = mk(n=12)
    run(m, "a", P40)
    m.lookup("b", P40 + [1])
    before = fingerprint(m)
    m.lookup("big", list(range(200)))
    before_big = fingerprint(m)
    with pytest.raises(AdmissionRefused) as e:
        m.allocate("big", 200)
    assert e.value.value and fingerprint(m) == before_big
    m.free("big")
    assert fingerprint(m) == before
    assert m.lookup("b", P40 + [1]).reuse_tokens == 40


def test_swa_churn_does_not_flush_other_prefixes():
    """A long decode releases window pages and superseded end snapshots every few tokens;
    they go back to the free list and never push another request's checkpoint out."""
    sizes = {pk: (7 if pk[0] == "swa" else 48) for pk in LAY.pool_keys()}   # 3 held + 4 working
    m = mk(n=sizes)
    run(m, "a", P40)
    run(m, "b", [1, 2, 3, 4], decode=[(5 * i) % 200 for i in range(120)])
    m.check_invariants()
    churn = m.metrics.transitions[("swa", WRITING, FREE)] + \
        m.metrics.transitions.get(("swa", READY, FREE), 0)
    assert churn > 50 and not m.metrics.evictions.get("swa")
    assert m.lookup("c", P40 + [7]).reuse_tokens == 40


def test_drafts_never_published_and_reject_rolls_back():
    m = mk()
    run(m, "a", P40[:20])
    m.lookup("d", P40[:30])
    commit_all(m, "d", m.allocate("d", 10))
    keep = fingerprint(m)[1]
    m.allocate("d", 0, num_draft_tokens=6)
    assert fingerprint(m)[1] == keep                    # nothing draft in the index
    assert m.lookup("o", P40[:38]).reuse_tokens <= 30
    m.free("o")
    m.reject_drafts("d")
    assert fingerprint(m)[1] == keep
    m.allocate("d", 0, num_draft_tokens=3)
    m.accept_drafts("d", P40[30:33])                    # all accepted: committed
    assert m.requests["d"].num_computed_tokens == 33
    m.allocate("d", 0, num_draft_tokens=4)
    assert m.accept_drafts("d", P40[33:35]) == (34,)   # 2 of 4: allocated, to recompute
    assert (m.requests["d"].num_computed_tokens, m.requests["d"].num_allocated_tokens) == (33, 35)
    m.commit("d", 1, P40[33:34])                        # ends on the checkpoint at 34
    m.commit("d", 1, P40[34:35])
    m.free("d")
    assert m.lookup("e", P40[:35] + [1]).reuse_tokens == 34
    m.check_invariants()


@pytest.mark.parametrize("call,exc,value", [
    (lambda m: m.allocate("nope", 3), UnknownRequest, "nope"),
    (lambda m: m.lookup("b", [1, -2, 3]), BadTokens, (1, -2)),
    (lambda m: m.lookup("b", [1, 256]), BadTokens, (1, 256)),
    (lambda m: m.lookup("b", [1, 2.0]), BadTokens, (1, 2.0)),
    (lambda m: m.lookup("b", [1, True]), BadTokens, (1, True)),
    (lambda m: m.lookup("b", [1, 2], salt="t"), BadSalt, "str"),
    (lambda m: m.commit("p", 99), CommitPastAllocation, (99, 4)),
    (lambda m: m.allocate("p", -1), BadArgument, -1),
    (lambda m: m.allocate("p", True), BadArgument, True),
    (lambda m: m.allocate("p", 2.0), BadArgument, 2.0),
    (lambda m: m.allocate("p", 1, num_draft_tokens=-1), BadArgument, -1),
    (lambda m: m.allocate("p", 1, num_draft_tokens=0.0), BadArgument, 0.0),
    (lambda m: m.commit("p", -1), BadArgument, -1),
    (lambda m: m.commit("p", False), BadArgument, False),
    (lambda m: m.commit("p", 1.0), BadArgument, 1.0),
    (lambda m: m.lookup("p", [1, 2]), RequestBusy, "p"),
    (lambda m: m.commit("p", 4, [1, 2, 3]), BadTokens, (3, 4)),
    (lambda m: m.relocate("comp", "nope", 0), BadArgument, ("comp", "nope")),
    (lambda m: m.read_ok(None), BadArgument, None),
    (lambda m: m.read_ok("a read"), BadArgument, "a read"),
    (lambda m: m.launch_pins("p", "no-such-group"), BadArgument, "no-such-group"),
    (lambda m: m.launch_pins("nobody"), UnknownRequest, "nobody"),
    (lambda m: m.layer_pools(99), BadArgument, 99),
    (lambda m: m.kernel_abi("comp", "nope"), BadArgument, ("comp", "nope")),
    (lambda m: m.bump_indexer_version(sweep="yes"), BadArgument, "yes"),
    (lambda m: m.tables(None), UnknownRequest, None),
    (lambda m: m.free(["p"]), UnknownRequest, ["p"]),
    (lambda m: CacheManager.pool_sizes(LAY, -1, 2), BadArgument, -1),
])
def test_bad_input_named_error_and_nothing_changed(call, exc, value):
    m = mk()
    run(m, "a", P40)
    m.lookup("p", P40[:10])
    m.allocate("p", 4)
    before = fingerprint(m)
    with pytest.raises(exc) as e:
        call(m)
    assert e.value.value == value
    assert fingerprint(m) == before


def test_huge_allocation_refused_in_constant_work():
    """allocate(rid, 10**9) is refused from closed-form counts: no block list is built."""
    m = mk()
    m.lookup("x", P40)
    before = fingerprint(m)
    with pytest.raises(AdmissionRefused):
        m.allocate("x", 10 ** 9)
    with pytest.raises(AdmissionRefused):
        m.allocate("x", 1 << 40)
    assert fingerprint(m) == before


def test_toctou_relocated_object_is_refused_and_pinned_cannot_move():
    """A block the plan checked moved before the allocation pinned it: StaleRead, nothing
    changed; a fresh lookup sees the new address; a pinned block refuses to move."""
    m = mk()
    run(m, "a", P40)
    plan = m.lookup("b", P40 + [1])
    tail = next(r for r in plan.reads if r.ref.kind == "tail")
    m.relocate(*tail.ref)                    # moved after the lookup checked it
    before = fingerprint(m)
    with pytest.raises(StaleRead):
        m.allocate("b", 1)
    assert fingerprint(m) == before
    plan = m.lookup("b", P40 + [1])
    now = next(r for r in plan.reads if r.ref == tail.ref)
    assert now.ep == tail.ep + 1
    m.allocate("b", 1)
    with pytest.raises(Refused):
        m.relocate(*tail.ref)                # pinned: no relocation
    assert all(p.pins >= 1 for p in m.launch_pins("b"))
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
    m = mk()
    run(m, "a", P40)
    pool = m.pools[("tail", "csa")]
    b = next(i for i, r in enumerate(pool.recs) if r.st == READY)
    pool.recs[b] = pool.recs[b]._replace(rows=0)        # a published tail that lost rows
    with pytest.raises(InvariantViolation) as e:
        m.check_invariants()
    assert e.value.value in ("published_complete", "pool_integrity")
