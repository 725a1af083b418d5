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
from hypothesis.errors import FlakyFailure
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from hybridkv.cache import CacheManager
from hybridkv.cache.disklink import DiskLink
from hybridkv.cache.manager import CacheManager as Manager
from hybridkv.disk import DiskTier, LocalBackend
from hybridkv.errors import AdmissionRefused, CacheError, StaleRead
from tests.cache.helpers import LAY, fingerprint
from tests.cache.seeded import old_counting, unreserved_spills
from tests.disk.test_spill_epoch import FullDisk

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


class SwitchableDisk(LocalBackend):
    """A real local backend whose writes fail with ENOSPC while ``ops.full``; counts write
    attempts per (blob, tier epoch): a failed spill may be retried only after a change."""

    def __init__(self, root):
        self.ops = FullDisk()
        self.ops.full = False
        super().__init__(root, self.ops)
        self.tier, self.attempts = None, {}

    def put(self, name, parts):
        at = (name, self.tier.epoch if self.tier is not None else -1)
        self.attempts[at] = self.attempts.get(at, 0) + 1
        return super().put(name, parts)


def make_manager(args, disk_dir):
    """The manager and its disk tier; ``args["in_flight"]`` is the tier's write budget (8
    unless given).  A spill the budget defers depends on how fast the writer threads finish,
    so a search that must find a defect deterministically gives the tier a budget it never
    fills: then what is in transit follows the calls alone (spills leave it when reaped)."""
    backend = SwitchableDisk(disk_dir)
    tier = DiskTier(capacity_bytes=1 << 24, max_in_flight=args.get("in_flight", 8),
                    backend=backend)
    backend.tier = tier
    return CacheManager(LAY, num_blocks=args["blocks"], every_n=args["every"], cap=args["cap"],
                        checked=True, check_every=4, disk=tier), tier


def replay(path):
    """Run a recorded trace again on a fresh manager and re-check it; returns the problems
    found (the same checks the machine makes: a refused allocate that changed the cache, a
    spill retried with nothing changed, an unnamed error, an invariant)."""
    with open(path) as f:
        trace = json.load(f)
    disk = tempfile.mkdtemp()
    m, tier = make_manager(trace["manager"], disk)
    problems = []
    try:
        for method, args in trace["calls"]:
            if method == "@disk_full":
                tier.backend.ops.full = args[0]
                continue
            before = observe(m) if method == "allocate" else None
            try:
                getattr(m, method)(*args)
            except AdmissionRefused:
                if observe(m) != before:
                    problems.append(f"refused allocate{tuple(args)!r} changed the cache")
            except CacheError:
                pass
            except AssertionError as e:                 # checked mode: an invariant
                problems.append(str(e))
            except Exception as e:
                problems.append(f"{method}{tuple(args)!r} raised {type(e).__name__}")
            if any(n > 2 for n in tier.backend.attempts.values()):
                problems.append("spills retried with nothing changed")
            if problems:
                break
        return problems
    finally:
        tier.close()
        shutil.rmtree(disk, ignore_errors=True)


def observe(m):
    stats = {k: v for k, v in m.stats().items() if k not in ("hit", "partial", "miss", "disk")}
    return fingerprint(m), stats, m.kv_bytes_held()


class Refusals(RuleBasedStateMachine):
    in_flight = 8               # the disk tier's write budget

    @initialize(blocks=st.integers(8, 14), every=st.sampled_from([0, 16]),
                cap=st.sampled_from([24, 32, 40, 200]), short=st.sampled_from([24, 40]),
                long=st.sampled_from([56, 80, 96]), other=st.sampled_from([8, 16, 40]))
    def setup(self, blocks, every, cap, short, long, other):
        """A small cache with a disk tier, opened by overlapping prompts computed
        concurrently (``race``); the rules then go on from there."""
        self.args = {"blocks": blocks, "every": every, "cap": cap, "in_flight": self.in_flight}
        self.disk = tempfile.mkdtemp()
        self.m, self.tier = make_manager(self.args, self.disk)
        self.rec = Recorder(self.args)
        self.prompts = {}        # rid -> its tokens (looked up, maybe computing)
        self.done = {}           # rid -> positions committed
        self.n = 0
        self.race(short, long, other)

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

    @rule(short=st.sampled_from([24, 40]), long=st.sampled_from([56, 80, 96]),
          other=st.sampled_from([8, 16, 40]))
    def race(self, short, long, other):
        """Two overlapping prompts computed concurrently: A looks up, B (A's prefix) is
        computed and freed meanwhile, then A computes past B's end (its chain hangs off B's
        cached blocks); then another tenant's prompt C arrives under that pressure."""
        if len(self.prompts) >= 2:
            return
        a, b, c = self.n + 1, self.n + 2, self.n + 3
        self.n += 3
        self.lookup_as(f"r{a}", BASES[0][:long])
        self.lookup_as(f"r{b}", BASES[0][:short])
        self._compute(f"r{b}", short)
        if f"r{b}" in self.prompts:
            self.free_rid(f"r{b}")
        self._compute(f"r{a}", long)
        self.lookup_as(f"r{c}", BASES[1][:other])
        self._compute(f"r{c}", other)

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

    @rule(full=st.booleans())
    def spill_all(self, full):
        """The disk fills up (or gets space back), then spill_all: it returns promptly on a
        full disk, and a failed spill waits for a change (no retry storm).  Writes are
        counted per (object, tier epoch at the write): a spill started before a change may
        write once in the new epoch and once more after it, never a third time.  Eviction
        spills meanwhile see the same disk."""
        self.tier.backend.ops.full = full
        self.rec.calls.append(("@disk_full", [full]))
        for _ in range(3 if full else 1):       # on a full disk the caller tries again
            t0 = time.monotonic()
            counts = self._call("spill_all", 2.0)
            took = time.monotonic() - t0
            if full and took > 1.0:
                self._fail(f"spill_all on a full disk took {took:.2f} s: {counts}")
            storm = {k: n for k, n in self.tier.backend.attempts.items() if n > 2}
            if storm:
                self._fail(f"spills retried with nothing changed: {sorted(storm.values())[-3:]}")

    @invariant()
    def invariants(self):
        if hasattr(self, "m"):
            try:
                self.m.check_invariants()
            except AssertionError as e:
                self._fail(str(e))


class WideTier(Refusals):
    """Refusals on a tier whose write budget is never full (no spill deferred by timing)."""
    in_flight = 1024


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))
TestRefusals = Refusals.TestCase
TestRefusals.settings = settings(max_examples=40, stateful_step_count=30, **SETTINGS)


@pytest.mark.slow
def test_refusals_deep():
    run_state_machine_as_test(Refusals, settings=settings(
        max_examples=500, stateful_step_count=50, **SETTINGS))


def _retry_storm(monkeypatch):
    """spill_all and eviction spills retry a failed object with nothing changed."""
    monkeypatch.setattr(DiskLink, "gave_up", lambda self, key: False)


def _unchecked_reads(monkeypatch):
    """read_ok without its argument check (an unnamed AttributeError on a non-Read)."""
    def read_ok(self, read):
        rec = self.pools[(read.ref.kind, read.ref.group)].recs[read.ref.block]
        return rec.pins > 0
    monkeypatch.setattr(Manager, "read_ok", read_ok)


@pytest.mark.parametrize("seed_bug, found", [
    (old_counting, "changed the cache"),
    (unreserved_spills, "admission_cap"),
    (_retry_storm, "retried with nothing changed"),
    (_unchecked_reads, "raised AttributeError"),
])
def test_each_old_defect_is_found_when_seeded_back(monkeypatch, seed_bug, found):
    seed_bug(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises((AssertionError, FlakyFailure)) as e:
        run_state_machine_as_test(WideTier, settings=settings(
            max_examples=200, stateful_step_count=25, database=None, derandomize=True,
            phases=[Phase.generate], report_multiple_bugs=False, **SETTINGS))
    error = e.value
    if isinstance(error, FlakyFailure):       # timing-dependent (async spills): its first run
        error = error.exceptions[0]
    assert found in str(error), str(error)[:500]
    path = str(error).rsplit("trace: ", 1)[-1].strip()
    problems = replay(path)                   # the recorded trace reproduces it
    os.unlink(path)
    assert any(found.split(" ")[-1] in p for p in problems), problems
    print(f"{seed_bug.__name__}: found in {time.monotonic() - t0:.1f} s, replayed: {problems}")
