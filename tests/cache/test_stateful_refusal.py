"""Hypothesis stateful test of refusals and hostile calls (issue 20): small pools, a disk tier
(spills on eviction), overlapping prompts computed concurrently (a request looks up, others
compute and free meanwhile, then it computes in chunks), hostile arguments.  After every
refused allocation the state, stats, bytes held and other lookups are what they were; every
hostile call raises a named error and changes nothing; checked mode asserts the invariants
after every call.  Every call is recorded (``Recorder``): a failure writes the trace as JSON
and ``replay`` runs it again on a fresh manager, so a rare failure can be reproduced."""
import json
import os
import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from hybridkv.cache import CacheManager
from hybridkv.cache.admission import Admission
from hybridkv.cache.eviction import Evictor
from hybridkv.disk import DiskTier
from hybridkv.errors import AdmissionRefused, CacheError, StaleRead
from tests.cache.helpers import LAY, fingerprint

BASES = [[(7 * i + 3) % 250 for i in range(96)], [(11 * i + 5) % 250 for i in range(96)]]
HOSTILE = [
    ("read_ok", [None]), ("read_ok", ["a read"]), ("launch_pins", ["@rid", "no-such-group"]),
    ("launch_pins", ["nobody"]), ("allocate", ["@rid", -1]), ("allocate", ["@rid", 1.5]),
    ("commit", ["@rid", 10 ** 6]), ("commit", ["@rid", 1, [10 ** 9]]),
    ("lookup", ["@new", [1, -2]]), ("lookup", ["@new", [1, 2], "salt"]),
    ("free", ["nobody"]), ("layer_pools", [999]), ("kernel_abi", ["comp", "nope"]),
    ("relocate", ["comp", "csa", 10 ** 6]), ("accept_drafts", ["@rid", [1]]),
    ("wait_loads", [-1]), ("spill_all", ["soon"]), ("tables", [None]),
]


class Recorder:
    """Every call made on the manager, in order, as JSON-able (method, args) pairs."""

    def __init__(self, manager_args):
        self.manager_args, self.calls = manager_args, []

    def call(self, m, method, *args):
        self.calls.append((method, list(args)))
        return getattr(m, method)(*args)

    def dump(self, why):
        fd, path = tempfile.mkstemp(prefix="hybridkv-trace-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"manager": self.manager_args, "calls": self.calls, "why": why}, f)
        return path


def make_manager(args, disk_dir):
    tier = DiskTier(disk_dir, capacity_bytes=1 << 24, max_in_flight=8)
    return CacheManager(LAY, num_blocks=args["blocks"], every_n=args["every"], cap=args["cap"],
                        checked=True, check_every=4, disk=tier), tier


def replay(path):
    """Run a recorded trace again on a fresh manager (named errors are part of the trace);
    returns the manager after the last call (checked mode raises at the failing one)."""
    with open(path) as f:
        trace = json.load(f)
    disk = tempfile.mkdtemp()
    m, tier = make_manager(trace["manager"], disk)
    try:
        for method, args in trace["calls"]:
            try:
                getattr(m, method)(*args)
            except CacheError:
                pass
        return m
    finally:
        tier.close()
        shutil.rmtree(disk, ignore_errors=True)


def observe(m):
    stats = {k: v for k, v in m.stats().items() if k not in ("hit", "partial", "miss", "disk")}
    return fingerprint(m), stats, m.kv_bytes_held()


class Refusals(RuleBasedStateMachine):
    @initialize(blocks=st.integers(8, 14), every=st.sampled_from([0, 16]),
                cap=st.sampled_from([24, 40, 200]))
    def setup(self, blocks, every, cap):
        self.args = {"blocks": blocks, "every": every, "cap": cap}
        self.disk = tempfile.mkdtemp()
        self.m, self.tier = make_manager(self.args, self.disk)
        self.rec = Recorder(self.args)
        self.prompts = {}        # rid -> its tokens (looked up, maybe computing)
        self.done = {}           # rid -> positions committed
        self.n = 0

    def teardown(self):
        if hasattr(self, "tier"):
            self.tier.close()
            shutil.rmtree(self.disk, ignore_errors=True)

    def _fail(self, why):
        raise AssertionError(f"{why}; trace: {self.rec.dump(why)}")

    def _call(self, method, *args):
        try:
            return self.rec.call(self.m, method, *args)
        except CacheError:
            raise
        except Exception as e:              # an unnamed error is a defect in itself
            self._fail(f"{method}{tuple(args)!r} raised {type(e).__name__}: {e}")

    @rule(base=st.sampled_from([0, 0, 1]), cut=st.sampled_from([8, 24, 40, 56, 80, 96]),
          extra=st.lists(st.integers(0, 249), max_size=3))
    def lookup(self, base, cut, extra):
        if len(self.prompts) >= 4:
            return
        self.n += 1
        self.lookup_as(f"r{self.n}", BASES[base][:cut] + extra)

    @rule(short=st.sampled_from([24, 40]), long=st.sampled_from([56, 80, 96]))
    def race(self, short, long):
        """Two overlapping prompts computed concurrently: A looks up, B (A's prefix) is
        computed and freed meanwhile, then A computes past B's end (its chain hangs off B's
        cached blocks)."""
        if len(self.prompts) >= 3:
            return
        a, b = self.n + 1, self.n + 2
        self.n += 2
        self.lookup_as(f"r{a}", BASES[0][:long])
        self.lookup_as(f"r{b}", BASES[0][:short])
        self._compute(f"r{b}", short)
        if f"r{b}" in self.prompts:
            self.free_rid(f"r{b}")
        self._compute(f"r{a}", long)

    def lookup_as(self, rid, toks):
        self._call("lookup", rid, toks)
        self.prompts[rid], self.done[rid] = toks, None

    def free_rid(self, rid):
        self._call("free", rid)
        del self.prompts[rid], self.done[rid]

    @precondition(lambda self: self.prompts)
    @rule(pick=st.integers(0, 9), chunk=st.sampled_from([8, 16, 96]))
    def compute(self, pick, chunk):
        self._compute(sorted(self.prompts)[pick % len(self.prompts)], chunk)

    def _compute(self, rid, chunk):
        if rid not in self.prompts:
            return
        toks, m = self.prompts[rid], self.m
        start = self.done[rid]
        if start is None:
            start = m.requests[rid].plan.reuse_tokens
        if start >= len(toks):
            return
        before = observe(m)
        try:
            a = self._call("allocate", rid, min(chunk, len(toks) - start))
        except AdmissionRefused:
            if observe(m) != before:
                self._fail(f"refused allocate({rid!r}) changed the cache")
            return
        except StaleRead:
            self.free_rid(rid)
            return
        L = a.start
        for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
            self._call("commit", rid, P - L)
            L = P
        self.done[rid] = L

    @precondition(lambda self: self.prompts)
    @rule(pick=st.integers(0, 9))
    def free(self, pick):
        self.free_rid(sorted(self.prompts)[pick % len(self.prompts)])

    @rule(which=st.integers(0, len(HOSTILE) - 1), pick=st.integers(0, 9))
    def hostile(self, which, pick):
        method, args = HOSTILE[which]
        rid = sorted(self.prompts)[pick % len(self.prompts)] if self.prompts else "nobody"
        args = [rid if a == "@rid" else "fresh" if a == "@new" else a for a in args]
        before = observe(self.m)
        try:
            self._call(method, *args)
        except CacheError:
            if observe(self.m) != before:
                self._fail(f"refused {method}{tuple(args)!r} changed the cache")
            return
        if method not in ("launch_pins", "read_ok", "wait_loads", "spill_all", "tables"):
            self._fail(f"hostile {method}{tuple(args)!r} was accepted")

    @rule()
    def settle_disk(self):
        self._call("wait_loads", 1.0)

    @invariant()
    def invariants(self):
        if hasattr(self, "m"):
            try:
                self.m.check_invariants()
            except AssertionError as e:
                self._fail(str(e))


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))
TestRefusals = Refusals.TestCase
TestRefusals.settings = settings(max_examples=40, stateful_step_count=30, **SETTINGS)


@pytest.mark.slow
def test_refusals_deep():
    run_state_machine_as_test(Refusals, settings=settings(
        max_examples=500, stateful_step_count=50, **SETTINGS))


def _old_counting(monkeypatch):
    monkeypatch.setattr(Evictor, "available",
                        lambda self, pk: self.pools[pk].n_free + len(self.cached[pk]))
    monkeypatch.setattr(Evictor, "takeable",
                        lambda self, ref: ref.block in self.cached[(ref.kind, ref.group)])


def _unreserved_spills(monkeypatch):
    def make_room(self, need):
        for pk, k in need.items():
            self.evictor.make_room(pk, k)
    monkeypatch.setattr(Admission, "make_room", make_room)


@pytest.mark.parametrize("seed_bug, found", [
    (_old_counting, "changed the cache"),
    (_unreserved_spills, "admission_cap"),
])
def test_each_old_defect_is_found_when_seeded_back(monkeypatch, seed_bug, found):
    seed_bug(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as e:
        run_state_machine_as_test(Refusals, settings=settings(
            max_examples=200, stateful_step_count=25, database=None, derandomize=True,
            phases=[Phase.generate], report_multiple_bugs=False, **SETTINGS))
    assert found in str(e.value), str(e.value)[:500]
    path = str(e.value).rsplit("trace: ", 1)[-1].strip()
    with pytest.raises(AssertionError):     # the recorded trace reproduces it
        m = replay(path)
        assert not _refusal_changed(path), "replayed without the failure"
        m.check_invariants()
    os.unlink(path)
    print(f"{seed_bug.__name__}: found in {time.monotonic() - t0:.1f} s")


def _refusal_changed(path):
    with open(path) as f:
        return "changed the cache" in json.load(f)["why"]
