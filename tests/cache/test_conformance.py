"""Conformance: the runtime's object-level driver against spec.step, step by step.

After every action the runtime abstracted (ObjectDriver.abstract) equals spec.step applied
to the same action, enabledness included (a refused action changes nothing), and every spec
invariant holds on it.  Rules build each "hash hit but state incomplete" case.  A seeded bug
(one readiness check dropped from the runtime's lookup) must be found by the same machine.
"""
import time

import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import spec
from hybridkv.cache import funnel as LK
from hybridkv.errors import Refused
from hybridkv.cache import CacheManager
from hybridkv.cache.tables import TransitionRefused
from hybridkv.testing.driver import ObjectDriver
from spec.config import SysConfig
from spec.invariants import INVARIANTS

CFG = SysConfig()
ACTS = spec.actions(CFG)
NK = len(spec.KINDS)
COMP, TAIL, SWA, IDX = range(NK)
POS = st.integers(1, CFG.max_pos)
OBJ = st.integers(0, CFG.n_obj - 1)


class Conformance(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.mgr = CacheManager.for_spec(CFG, checked=True)
        self.drv = ObjectDriver(self.mgr)
        self.s = spec.initial(CFG)
        self.trace = []

    def apply(self, name, args):
        en, nxt = spec.step(self.s, CFG, name, args)
        try:
            self.drv.do(name, args)
            ran = True
        except (Refused, TransitionRefused):
            ran = False
        self.trace.append((name, args, bool(en)))
        assert ran == bool(en), f"runtime {'ran' if ran else 'refused'} {name}{args}; spec " \
                                f"{'enabled' if en else 'disabled'}"
        if en:
            self.s = nxt
        assert self.drv.abstract() == self.s, (name, args)

    @rule(a=st.sampled_from(ACTS))
    def any_action(self, a):
        self.apply(*a)

    @rule(k=st.integers(0, NK - 1), i=OBJ, p=POS, via_draft=st.booleans())
    def make_ready(self, k, i, p, via_draft=False):
        first = [("draft", (k, i, p)), ("accept", (k, i))] if via_draft else [("write", (k, i, p))]
        for name, args in first + [("fill", (k, i)), ("publish", (k, i)), ("seal", (k, i))]:
            self.apply(name, args)

    @rule(k=st.integers(0, NK - 1), i=OBJ, p=POS)
    def abandon(self, k, i, p):
        self.apply("draft", (k, i, p))
        self.apply("reject", (k, i))

    @rule(i=OBJ)
    def stale_cycle(self, i):
        self.apply("mark_stale", (i,))
        self.apply("drop_stale", (i,))

    @rule(case=st.sampled_from(["tail_short", "window_slid", "idx_stale", "disk_inflight",
                                "draft", "idx_behind", "comp_short"]), i=OBJ, p=POS)
    def incomplete(self, case, i, p):
        """Build one 'hash hit but state incomplete' case through spec actions."""
        steps = {
            "tail_short": [("write", (TAIL, i, p))],
            "comp_short": [("write", (COMP, i, p))],
            "idx_behind": [("write", (IDX, i, p))],
            "window_slid": [("write", (SWA, i, p)), ("fill", (SWA, i)), ("publish", (SWA, i)),
                            ("seal", (SWA, i)),
                            ("slide", (i,))],
            "idx_stale": [("write", (IDX, i, p)), ("fill", (IDX, i)), ("publish", (IDX, i)),
                          ("seal", (IDX, i)),
                          ("bump_version", ())],
            "disk_inflight": [("write", (COMP, i, p)), ("fill", (COMP, i)),
                              ("publish", (COMP, i)), ("seal", (COMP, i)),
                              ("spill_start", (0, COMP, i)), ("spill_done", (0, COMP)),
                              ("evict", (COMP, i)), ("load_start", (0, COMP, i))],
            "draft": [("draft", (TAIL, i, p))],
        }[case]
        for name, args in steps:
            self.apply(name, args)

    @rule(case=st.sampled_from(["tail_short", "window_slid", "idx_stale", "disk_inflight",
                                "draft", "idx_behind", "comp_short"]), i=OBJ, p=POS,
          r=st.integers(0, CFG.n_req - 1))
    def hit_but_incomplete(self, case, i, p, r):
        """Every other kind ready at p, one kind incomplete, then the hash hit at p: the
        runtime must refuse exactly when the spec does."""
        broken = {"tail_short": TAIL, "window_slid": SWA, "idx_stale": IDX, "idx_behind": IDX,
                  "disk_inflight": COMP, "draft": TAIL, "comp_short": COMP}[case]
        for k in range(NK):
            if k != broken:
                self.make_ready(k, i, p)
        self.incomplete(case, i, p)
        self.lookup_best(r, p)

    @rule(r=st.integers(0, CFG.n_req - 1), H=POS)
    def lookup_best(self, r, H):
        """Lookup with, per kind, the object whose position is H (the hash hit)."""
        ref = []
        for k, objs in enumerate(self.s.mem):
            pos = [o[5] for o in objs]                   # h / hi: first content field
            ref.append(pos.index(H) if H in pos else 0)
        self.apply("lookup", (r, tuple(ref), H))

    @rule(r=st.integers(0, CFG.n_req - 1), then_release=st.booleans())
    def pin_launch(self, r, then_release=False):
        for name in ("pin", "launch") + (("release",) if then_release else ()):
            self.apply(name, (r,))

    @rule(k=st.integers(0, NK - 1), i=OBJ, p=POS, f=st.integers(-1, CFG.n_faults - 1),
          end=st.sampled_from(["load_ok", "load_bad", "load_cancel"]))
    def disk_cycle(self, k, i, p, f, end):
        """Spill a ready object, maybe damage the file, load it back, drop the file."""
        self.make_ready(k, i, p)
        self.apply("spill_start", (0, k, i))
        self.apply("spill_done" if f >= 0 else "spill_crash", (0, k))
        if f >= 0:
            self.apply("damage", (0, f))
        self.apply("evict", (k, i))
        self.apply("load_start", (0, k, i))
        self.apply(end, (0, k))
        self.apply("drop", (0,))

    @rule(r=st.integers(0, CFG.n_req - 1), k=st.integers(0, NK - 1), i=OBJ,
          stale=st.booleans())
    def graph_cycle(self, r, k, i, stale):
        """Capture a running request's addresses; relocate or release; replay (I4)."""
        self.apply("capture", (0, r))
        if stale:
            self.apply("release", (r,))
            self.apply("relocate", (k, i))
        self.apply("replay", (0,))
        self.apply("release_graph", (0,))
        self.apply("forget", (r,))

    @invariant()
    def spec_invariants(self):
        for name, fn in INVARIANTS.items():
            assert fn(self.s, CFG), name
        self.mgr.check_invariants()


TestConformance = Conformance.TestCase
TestConformance.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                    suppress_health_check=list(HealthCheck))


@pytest.mark.slow
def test_conformance_deep():
    run_state_machine_as_test(Conformance, settings=settings(
        max_examples=3000, stateful_step_count=60, deadline=None,
        suppress_health_check=list(HealthCheck)))


def test_conformance_reaches_enabled_actions():
    """Non-vacuity: a seeded random walk of the rules enables most spec actions (so the
    equality checks compare real transitions, not refusals)."""
    import random
    rng = random.Random(7)
    enabled = set()
    for _ in range(40):
        m = Conformance()
        for _ in range(40):
            kind = rng.randrange(6)
            if kind == 0:
                m.any_action(rng.choice(ACTS))
            elif kind == 1:
                m.make_ready(rng.randrange(NK), rng.randrange(CFG.n_obj), rng.randint(1, 3),
                             rng.random() < 0.3)
                m.stale_cycle(rng.randrange(CFG.n_obj))
                m.abandon(rng.randrange(NK), rng.randrange(CFG.n_obj), rng.randint(1, 3))
            elif kind == 2:
                m.hit_but_incomplete(rng.choice(["tail_short", "window_slid", "idx_stale",
                                                 "disk_inflight", "draft", "idx_behind"]),
                                     rng.randrange(CFG.n_obj), rng.randint(1, 3),
                                     rng.randrange(CFG.n_req))
            elif kind == 3:
                m.pin_launch(rng.randrange(CFG.n_req), rng.random() < 0.3)
            elif kind == 4:
                m.disk_cycle(rng.randrange(NK), rng.randrange(CFG.n_obj), rng.randint(1, 3),
                             rng.randint(-1, 3), rng.choice(["load_ok", "load_bad", "load_cancel"]))
            else:
                r, H = rng.randrange(CFG.n_req), rng.randint(1, 3)
                for k in range(NK):
                    m.make_ready(k, 0, H)
                m.lookup_best(r, H)
                other = (r + 1) % CFG.n_req          # a second lookup, not taken
                m.lookup_best(other, H)
                m.apply("forget", (other,))
                m.pin_launch(r)
                m.graph_cycle(r, rng.randrange(NK), rng.randrange(CFG.n_obj), rng.random() < 0.5)
            m.spec_invariants()
        enabled |= {n for n, _, en in m.trace if en}
    missing = set(spec.ACTIONS) - enabled
    assert not missing, missing


def test_every_action_kind_exercised():
    """The action list the rules sample covers every spec action."""
    assert {n for n, _ in ACTS} == set(spec.ACTIONS)


def _find_seeded_bug(monkeypatch, kind, check, budget_s=60.0):
    kept = [c for c in LK.READY_CHECKS[kind] if c[0] != check]
    assert len(kept) < len(LK.READY_CHECKS[kind])
    monkeypatch.setitem(LK.READY_CHECKS, kind, kept)
    t0 = time.perf_counter()
    with pytest.raises(AssertionError) as err:
        run_state_machine_as_test(Conformance, settings=settings(
            max_examples=500, stateful_step_count=30, deadline=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck), derandomize=True, database=None))
    dt = time.perf_counter() - t0
    assert dt < budget_s
    return dt, str(err.value)


def test_seeded_bug_tail_readable_dropped_is_found(monkeypatch, record_property):
    """Drop 'readable' from the tail's readiness checks: a tail still being written (hash
    hit, rows short) would be reused.  The stateful test must catch it."""
    dt, msg = _find_seeded_bug(monkeypatch, "tail", "readable")
    record_property("seconds_to_find", dt)
    print(f"seeded bug (tail readable dropped) found in {dt:.2f}s")
    assert "lookup" in msg


@pytest.mark.parametrize("kind,check", [("idx", "covers"), ("swa", "covers"),
                                        ("comp", "readable")])
def test_other_seeded_bugs_are_found(monkeypatch, kind, check):
    dt, msg = _find_seeded_bug(monkeypatch, kind, check)
    print(f"seeded bug ({kind} {check} dropped) found in {dt:.2f}s")
    assert "lookup" in msg
