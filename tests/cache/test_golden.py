"""Golden counterexample traces (tests/golden/*.json) replayed against the runtime.

Each trace is a run of spec.step under a guard mutant that ends with an invariant broken.
(a) Without the mutant, the runtime (CacheManager.for_spec + its object driver, checked mode)
    must refuse exactly where the spec's step first refuses, changing nothing; up to there its
    abstract state equals spec.step's after every step and every invariant holds.
(b) With the mutant in force the runtime -- which calls the same guard functions, or, where it
    evaluates a system guard with its own code, has that conjunct's counterpart dropped
    (RUNTIME_COUNTERPARTS) -- accepts every step, tracks spec.step's state throughout and
    ends in the same state, where the trace's invariant is violated (and the runtime's own
    check_invariants says so).
"""
import contextlib
import pathlib
import re

import pytest

from hybridkv.cache import CacheManager
from hybridkv.cache import funnel as LK
from hybridkv.errors import InvariantViolation, Refused
from hybridkv.testing import driver as DRV
from hybridkv.testing import driver_disk as DRV_DISK
from hybridkv.testing.driver import ObjectDriver
from proofs import trace as tr
from proofs.mutate import Mutant, MutantError, applied, guards_called
from spec import INVARIANTS, KINDS, step

GOLDEN = sorted((pathlib.Path(__file__).parents[1] / "golden").glob("*.json"))
IDS = [p.stem for p in GOLDEN]
_VAR = {"comp": "comp", "tl": "tail", "sw": "swa", "ix": "idx"}   # names in can_lookup


def _counterpart(guard, conjunct):
    """(dict of named runtime checks, name) evaluating this spec conjunct, or None when the
    runtime calls the guard function itself."""
    if guard == "system.can_lookup":
        if conjunct == "Select(s.req, r).ph == IDLE":
            return DRV.LOOKUP_CHECKS, "phase"
        if conjunct.startswith("can_hit_aligned("):
            return DRV.LOOKUP_CHECKS, "aligned"
        m = re.fullmatch(r"readable\((\w+)\.st\)", conjunct)
        if m:
            return _ready(_VAR[m.group(1)]), "readable"
        m = re.fullmatch(r"m\[(\d)\]\.covers\((\w+), H, cx\)", conjunct)
        if m:
            assert KINDS[int(m.group(1))] == _VAR[m.group(2)]
            return _ready(_VAR[m.group(2)]), "covers"
    elif guard == "system.can_admit":
        return DRV.ADMIT_CHECKS, "admit"
    elif guard == "system.can_bump_version":     # the runtime calls the scalar guard itself
        import hybridkv.cache.manager as MG
        return _Seam(MG, "can_bump_indexer"), "can_bump_indexer"
    elif guard == "system.can_launch":
        if conjunct == "q.ph == HELD":
            return DRV.LAUNCH_CHECKS, "phase"
        if conjunct.startswith("*[can_read_pinned("):
            return DRV.LAUNCH_CHECKS, "read_ok"
    elif guard == "system.can_load_start":
        if conjunct == "rec.kind == k":
            return DRV_DISK.LOAD_START_CHECKS, "kind"
        if conjunct == "can_admit(s, c)":
            return DRV_DISK.LOAD_START_CHECKS, "admit"
        if conjunct == "Implies(rec.kind == IDX, rec.x == s.miv)":
            return DRV_DISK.LOAD_START_CHECKS, "version"
    else:
        return None
    raise AssertionError(f"no runtime counterpart for {guard}: {conjunct!r}: the runtime "
                         "evaluates this guard with its own code, conjunct by conjunct")


class _ReadyChecks(dict):
    """READY_CHECKS[kind] viewed as a name -> check dict (for dropping one)."""

    def __init__(self, kind):
        super().__init__(LK.READY_CHECKS[kind])
        self.kind = kind


def _ready(kind):
    return _ReadyChecks(kind)


class _Seam:
    """A module-level guard name the runtime calls for a whole system guard."""

    def __init__(self, module, name):
        self.module, self.name = module, name


@contextlib.contextmanager
def runtime_mutant(mutant, monkeypatch):
    """The spec mutant in force, plus its runtime counterpart dropped where there is one."""
    cp = _counterpart(mutant.guard, mutant.conjunct)
    if cp is not None:
        checks, name = cp
        if isinstance(checks, _Seam):
            monkeypatch.setattr(checks.module, checks.name, lambda *a, **k: True)
        elif isinstance(checks, _ReadyChecks):
            kept = [c for c in LK.READY_CHECKS[checks.kind] if c[0] != name]
            assert len(kept) < len(LK.READY_CHECKS[checks.kind])
            monkeypatch.setitem(LK.READY_CHECKS, checks.kind, kept)
        else:
            assert name in checks
            monkeypatch.delitem(checks, name)
    try:
        ctx = applied(mutant)
        ctx.__enter__()
    except MutantError as e:
        pytest.skip(f"golden trace out of date with the spec ({e}); proofs must regenerate it")
    try:
        yield cp
    finally:
        ctx.__exit__(None, None, None)


def _runtime(t, checked):
    c = tr.config_of(t)
    mgr = CacheManager.for_spec(c, checked=checked)
    drv = ObjectDriver(mgr)
    s = tr._start_state(t, c)
    if t.get("start") is not None:
        drv.restore(s)
    assert drv.abstract() == s
    return c, mgr, drv, s


def _try(drv, rec):
    try:
        drv.do(rec["action"], tr._args(rec))
        return True
    except Refused:
        return False


def test_golden_traces_exist():
    assert GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=IDS)
def test_runtime_refuses_where_the_unmutated_spec_does(path):
    _unmutated(tr.load(path))


def _unmutated(t):
    c, mgr, drv, s = _runtime(t, checked=True)
    for n, rec in enumerate(t["steps"]):
        en, s2 = step(s, c, rec["action"], tr._args(rec))
        before = drv.abstract()
        ran = _try(drv, rec)
        assert ran == bool(en), (f"step {n} {rec['action']}{tr._args(rec)}: runtime "
                                 f"{'ran' if ran else 'refused'}, spec "
                                 f"{'enabled' if en else 'disabled'}")
        mgr.check_invariants()                 # the runtime's own checks agree
        if not en:
            assert drv.abstract() == before, f"refused step {n} changed the runtime"
            return
        s = s2
        assert drv.abstract() == s, f"state differs from spec.step after step {n}"
        bad = [name for name, inv in INVARIANTS.items() if not inv(s, c)]
        assert not bad, f"unmutated run breaks {bad} after step {n}"


@pytest.mark.parametrize("path", GOLDEN, ids=IDS)
def test_runtime_reproduces_the_violation_under_the_mutant(path, monkeypatch):
    t = tr.load(path)
    mutant = Mutant(**t["mutant"])
    with runtime_mutant(mutant, monkeypatch) as cp:
        c, mgr, drv, s = _runtime(t, checked=False)

        def drive():
            nonlocal s
            for n, rec in enumerate(t["steps"]):
                en, s = step(s, c, rec["action"], tr._args(rec))
                assert en, f"step {n} disabled in the mutated spec"
                assert _try(drv, rec), f"runtime refused step {n} {rec['action']} under the mutant"
                assert drv.abstract() == s, f"state differs from spec.step after step {n}"

        called = guards_called(drive)
        if cp is None:      # the mutant reached the runtime through the guard function itself
            assert mutant.guard in called, f"runtime never called {mutant.guard}"
        end = drv.abstract()
        assert end == s
        violated = [name for name, inv in INVARIANTS.items() if not inv(end, c)]
        assert t["invariant"] in violated, violated
        with pytest.raises(InvariantViolation):
            mgr.check_invariants()


def test_trace_from_an_arbitrary_start_state():
    """A counterexample to induction starts from an arbitrary state: the runtime loads it
    (ObjectDriver.restore) and replays from there.  Built from a golden trace cut halfway."""
    from proofs.encode import leaf_paths
    from spec import initial
    t = tr.load(GOLDEN[0])
    c = tr.config_of(t)
    first_disabled = tr.replay(t).first_disabled      # cut where the spec still runs
    cut = (len(t["steps"]) if first_disabled < 0 else first_disabled) // 2
    flat = tr.states_of(dict(t, steps=t["steps"][:cut]))[-1]
    cti = dict(t, kind="cti", start=dict(zip(leaf_paths(initial(c)), flat)),
               steps=t["steps"][cut:])
    c, mgr, drv, s = _runtime(cti, checked=True)
    assert s != initial(c) and drv.abstract() == s
    mgr.check_invariants()
    _unmutated(cti)
