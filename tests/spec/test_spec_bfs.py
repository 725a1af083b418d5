"""Explicit-state BFS over spec.step: every invariant in every reachable state of tiny
configurations, every action enabled somewhere, and two seeded bugs found with short traces.

One configuration with every feature at once is too large for a Python BFS in the default
tier, so the default tier explores feature slices exhaustively (each slice's never-enabled
actions are exactly the ones its sizes switch off, and the slices together enable every
action); the slow tier explores the combined configuration.
"""
import pytest

import spec
from proofs.bfs import bfs
from spec.config import SysConfig
from spec.state import initial
from spec.step import actions
from spec.system import can_launch, can_lookup
from tests.spec.spec_mutants import drop_conjuncts

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_spec_bfs")

BASE = dict(n_obj=1, n_req=1, max_pos=1, window=1, cap=1)
LOADS = {"load_start", "load_ok", "load_bad", "load_cancel"}
SLICES = {
    # name: (sizes, actions those sizes switch off)
    "graphs+relocation": (dict(n_disk=0, n_graph=1, max_ver=0, max_ep=1),
                          {"evict", "slide", "drop_stale"}),
    "versions": (dict(n_disk=0, n_graph=0, max_ver=1, max_ep=0), {"relocate"}),
    # spills and every fault, without versions: a load needs a freed (re-versioned) block
    "disk-at-rest": (dict(n_disk=1, n_graph=0, max_ver=0, max_ep=0, n_faults=4),
                     {"evict", "slide", "drop_stale", "relocate"} | LOADS),
}
# loads need versions and a disk at once; that slice is exhaustive but slow
DISK_LOADS = dict(n_disk=1, n_graph=0, max_ver=1, max_ep=0, n_faults=1)


def _run(sizes, **kw):
    c = SysConfig(**{**BASE, **sizes})
    return c, bfs(c, initial(c), **kw)


@pytest.fixture(scope="module")
def explored():
    return {name: _run(sizes) for name, (sizes, _) in SLICES.items()}


def _enabled(c, r):
    return {name for name, _ in actions(c)} - set(r.never_enabled)


@pytest.mark.parametrize("name", SLICES)
def test_slice_reachable_states_keep_every_invariant(explored, name):
    c, r = explored[name]
    print(f"BFS {name}: {r.states} states, {r.transitions} transitions, {r.seconds:.1f}s")
    assert r.violation is None, r.violation
    assert set(r.never_enabled) == SLICES[name][1]
    assert r.states > 1000   # the slice is not trivially small


def test_slices_together_enable_every_action_but_loads(explored):
    enabled = set().union(*[_enabled(c, r) for c, r in explored.values()])
    assert set(spec.ACTIONS) - enabled == LOADS


@pytest.mark.slow
def test_disk_load_slice():
    c, r = _run(DISK_LOADS)
    print(f"BFS disk loads: {r.states} states, {r.seconds:.1f}s")
    assert r.violation is None and set(r.never_enabled) == {"relocate"}
    assert LOADS <= _enabled(c, r)


def test_seeded_bug_toctou_recheck_removed_is_caught():
    """launch without the version/epoch re-check: a relocation between lookup and pin
    goes unnoticed."""
    with drop_conjuncts(can_launch, lambda src: "can_read_pinned" in src):
        c, r = _run(SLICES["graphs+relocation"][0])
    assert r.violation is not None
    name, trace = r.violation
    print("TOCTOU bug:", name, trace)
    assert name == "toctou" and len(trace) <= 20
    assert [a for a, _ in trace][-2:] == ["pin", "launch"]
    assert "relocate" in [a for a, _ in trace]


def test_seeded_bug_lookup_ignores_tail_is_caught():
    """lookup that never looks at the tail resumes from a snapshot at another position."""
    with drop_conjuncts(can_lookup, lambda src: "tl" in src):
        c, r = _run(dict(n_disk=0, n_graph=0, max_ver=0, max_ep=0, max_pos=2))
    assert r.violation is not None
    name, trace = r.violation
    print("tail bug:", name, trace)
    assert name == "hit_soundness" and len(trace) <= 20


def test_unmutated_tail_configuration_is_safe():
    c, r = _run(dict(n_disk=0, n_graph=0, max_ver=0, max_ep=0, max_pos=2))
    assert r.violation is None
