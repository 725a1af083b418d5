"""The funnel tries checkpoint records only as far as some group's chain blocks are all in the
index (``funnel.reachable_limit``): past that every group fails whatever else holds, so the scan
of a long prompt's uncached rest (an engine re-asks a waiting request every step) stops there.

Random call sequences under memory pressure go to two managers in checked mode, one as shipped
and one scanning every position of the prompt (the bound answering ``limit``); after every call
both hold the same state and a lookup of each prefix (and of a longer prompt) gives the same
plan, candidates and rejections included, but for a record past a chain block the index
lacks (the chain to it dropped): the only thing the bound leaves out, never a hit, not tried.
Such a record arises without any forced drop: a request's chain block hangs from another
request's unfinished block (its key was taken), which that request's free rejects.
"""
import pytest
from hypothesis import given, settings

import hybridkv.cache.funnel as funnel
from hybridkv.cache.index import extend_chain, root_key
from hybridkv.cache.pool import ObjRef
from tests.cache.test_evict_runs import LAYOUTS, PREFIXES, calls, manager, play, state
from hybridkv.policy import ValuePolicy


def unbounded(monkeypatch):
    monkeypatch.setattr(funnel, "reachable_limit", lambda layout, runs, limit: limit)


def probe(m, rid):
    """Each prefix (and the first one grown past everything cached) looked up, the plans."""
    out = []
    for tokens in PREFIXES + [PREFIXES[0] + [9] * 60]:
        m.requests.pop(rid, None)
        out.append(m.lookup(rid, tokens))
    m.requests.pop(rid, None)
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=12, deadline=None)
@given(seq=calls)
def test_the_bounded_scan_plans_what_the_whole_scan_plans(layout, seq):
    ours = manager(LAYOUTS[layout], ValuePolicy, runs=True)
    whole = manager(LAYOUTS[layout], ValuePolicy, runs=True)
    for call in seq:
        with pytest.MonkeyPatch.context() as mp:
            out_whole = play(whole, *call)
            unbounded(mp)
            plans_whole = probe(whole, "probe")
        assert play(ours, *call) == out_whole, call
        for plan, plan_whole in zip(probe(ours, "probe"), plans_whole, strict=True):
            assert_same_plan(ours, plan, plan_whole)
        assert state(ours) == state(whole), call
    ours.check_invariants()


def past_a_missing_chain_block(m, keys, H):
    """Every group with a chain of its own lacks, in some chain pool, a chain block ending
    at or below H on the chain ``keys`` (so no group can resume at H)."""
    gran, groups = m.layout.granule, {}
    for kind, g in m.layout.chain_pools():
        groups.setdefault(g, []).append(kind)
    return all(any(m.index.chain_block(kind, g, keys[e // gran - 1]) is None
                   for kind in kinds
                   for e in range(m.layout.group(g).block_size, H + 1,
                                  m.layout.group(g).block_size))
               for g, kinds in groups.items())


def assert_same_plan(m, plan, whole):
    """The bounded scan's plan is the whole scan's, but for the records it leaves out: each
    lies past a chain block the index lacks (a request's unfinished block it hung from was
    rejected, or a block was dropped), and the whole scan rejected it."""
    skipped = [H for H in whole.candidates if H not in plan.candidates]
    assert list(plan.candidates) == [H for H in whole.candidates if H not in skipped]
    assert list(plan.rejections) == [r for r in whole.rejections if r.H not in skipped]
    rejected = {r.H for r in whole.rejections}
    for H in skipped:
        assert H in rejected and past_a_missing_chain_block(m, whole.chain_keys, H), H
    assert plan._replace(candidates=(), rejections=()) == \
        whole._replace(candidates=(), rejections=())


def test_a_block_end_past_a_dropped_chain_block_is_not_tried(monkeypatch):
    """Chain block 3 of a cached prompt dropped (as when its bytes went bad): the blocks past
    it stay indexed (dead: unreachable) and on a full layout each records its own end; the
    bounded scan stops before them, the whole scan tries and rejects each; both resume at
    the same point with the same reads."""
    full = LAYOUTS["full"]
    m = manager(full, ValuePolicy, runs=True)
    tokens = PREFIXES[0][:40]
    assert play(m, "done", 0, 0, 40, 0) == (0, None)
    keys = extend_chain([], root_key(full, b""), tokens, full.granule)
    m.evictor.drop(ObjRef("comp", "full", m.index.chain_block("comp", "full", keys[2])))
    assert m.index.chain_block("comp", "full", keys[5]) is not None     # past it: indexed
    ours = m.lookup("b", tokens + [9])
    m.requests.pop("b")
    unbounded(monkeypatch)
    whole = m.lookup("b", tokens + [9])
    assert ours.reuse_tokens == whole.reuse_tokens == 8
    assert ours.reads == whole.reads and ours.group_hits == whole.group_hits
    assert ours.candidates == (8,) and whole.candidates == (*range(40, 12, -4), 8)
    assert not ours.rejections and [r.H for r in whole.rejections] == list(range(40, 12, -4))
    m.check_invariants()


def test_a_window_group_leaves_the_scan_bounded_by_the_chains(monkeypatch):
    """full + SWA (a window group with no chain of its own): a long prompt sharing a short
    cached prefix is scanned only as far as the full group's chain is indexed, not to its end
    (the window group bounds nothing); the plan is the whole scan's."""
    layout = LAYOUTS["full+swa"]
    assert any(not set(g.kinds) & {"comp", "idx"} for g in layout.groups)
    m = manager(layout, ValuePolicy, runs=True)
    assert play(m, "done", 0, 0, 40, 0) == (0, None)
    prompt = PREFIXES[0][:40] + [199 - i % 50 for i in range(360)]
    scanned = []
    positions = funnel.candidate_positions

    def recording(keys, limit, *rest):
        scanned.append(limit)
        return positions(keys, limit, *rest)
    monkeypatch.setattr(funnel, "candidate_positions", recording)
    ours = m.lookup("b", prompt)
    m.requests.pop("b")
    unbounded(monkeypatch)
    whole = m.lookup("b", prompt)
    assert ours == whole and ours.reuse_tokens > 0
    assert scanned[0] <= 40 // layout.granule + 1 < scanned[1] == (len(prompt) - 1) // \
        layout.granule
    m.check_invariants()
