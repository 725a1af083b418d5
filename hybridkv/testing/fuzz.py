"""End-to-end stateful fuzzing of the engine (hypothesis): random multi-tenant, multi-turn
conversations with shared prefixes and drafts, plus cache floods (capacity pressure:
evictions, which spill with a disk tier), forced spills, disk faults (files truncated or bit-
flipped, reads failing with EIO through the tier's HookedBackend), indexer version bumps,
relocations of cached blocks and of the decode graph's buffers.  After every generation each
output must equal a cold recompute; after every rule ``cache.check_invariants()`` holds and
draft isolation holds end to end: every checkpoint the prefix index holds is a prefix of a
sequence that was really committed (the checks: hybridkv.testing.fuzzcheck).

``make_machine(engine_cls, ...)`` returns the RuleBasedStateMachine class (a seeded bug is an
engine class or seam, hybridkv.testing.bugs); ``run(examples, bug=None)`` runs it and reports,
with how many examples exercised each rule (``rules``) and each effect (``effects``: e.g. a
disk hit, a failed load, a rejected draft, a re-plan, a re-capture after relocation)."""
import contextlib
import io
import sys
import time
from collections import defaultdict
from typing import NamedTuple

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from hybridkv.testing import bugs, fuzzcheck, fuzzdisk

SYSTEM = [(37 * i + 11) % 256 for i in range(24)]
_MODEL = []


def model():
    if not _MODEL:
        import hybridkv as hk
        _MODEL.append(hk.V4Mini(seed=0))
    return _MODEL[0]


class FuzzResult(NamedTuple):
    examples: int
    failures: int
    seconds: float
    trace: str           # hypothesis' shrunk falsifying example ("" when none)
    find_seconds: float  # time until the first failing example (-1 when none failed)
    error: str = ""      # the final (shrunk) failure: "ExceptionType: message"
    rules: dict = {}     # rule -> examples that ran it
    effects: dict = {}   # effect -> examples where it happened


def _drafter():
    from hybridkv.engine import NgramDrafter

    class FuzzDrafter(NgramDrafter):
        """n-gram drafts, else the last token repeated: drafts on (nearly) every step."""

        def propose(self, tokens):
            return super().propose(tokens) or [tokens[-1]] * self.k

    return FuzzDrafter(8)


def make_machine(engine_cls, counter=None, tick=None, first=None, seen=None):
    import functools

    import hybridkv as hk
    seen = defaultdict(set) if seen is None else seen

    def rec(fn):
        """Count the rule per example; record when the first failure happened (before
        hypothesis starts shrinking)."""
        @functools.wraps(fn)
        def wrapped(self, *a, **kw):
            if counter is not None and fn.__name__ != "cache_ok":
                seen["rule:" + fn.__name__].add(counter[0])
            try:
                return fn(self, *a, **kw)
            except Exception:
                if first is not None:
                    first[0].setdefault("t", time.time() - first[1])
                raise
        return wrapped

    class EngineMachine(RuleBasedStateMachine):
        @initialize(blocks=st.integers(12, 32), k=st.integers(0, 3),
                    chunk=st.sampled_from([4, 8]),
                    disk=st.sampled_from([True, True, True, False]),
                    small_tier=st.booleans(), tenant=st.integers(0, 2),
                    shared=st.integers(0, 24),
                    user=st.lists(st.integers(0, 15), min_size=1, max_size=8))
        def setup(self, blocks, k, chunk, disk, small_tier, tenant, shared, user):
            if counter is not None:
                counter[0] += 1
                if tick:
                    tick()
            self.ex = counter[0] if counter is not None else 0
            self.fs = fuzzdisk.FaultyTier(small_tier) if disk else None
            self.cache = hk.CacheManager(model().layout(), num_blocks=blocks,
                                         disk=self.fs.tier if disk else None)
            self.eng = engine_cls(model(), self.cache, chunk=chunk, num_draft_tokens=3,
                                  max_running=3, drafter=_drafter(), load_timeout=5.0)
            self.eng.spec.k = k
            self.convs = [(b"t%d" % tenant, SYSTEM[:shared] + user)]   # (salt, tokens)
            self.legit = set()       # chain keys of every committed prefix
            self.last = self.eng.stats()
            self.last_disk = self._disk_counts()

        def teardown(self):
            if getattr(self, "fs", None) is not None:
                self.fs.close()

        def _disk_counts(self):
            link = self.cache.disk_link
            return dict(link.counts) if link is not None else {}

        def _effects(self, outs):
            s, dk = self.eng.stats(), self._disk_counts()
            eff = fuzzcheck.effect_counts(self.last, s, outs, self.last_disk, dk)
            self.last, self.last_disk = s, dk
            for k, v in eff.items():
                if v:
                    seen["effect:" + k].add(self.ex)

        def _generate(self, prompts, new, salts):
            outs = self.eng.generate(prompts, new, salts=salts)
            res = self.eng.last_outputs
            self.legit.update(fuzzcheck.committed_keys(self.cache.layout, res))
            fuzzcheck.check_outputs(model(), res)
            self._effects(res)
            return outs

        @rule(tenant=st.integers(0, 2), shared=st.integers(0, 24),
              user=st.lists(st.integers(0, 15), min_size=1, max_size=8))
        @rec
        def new_conversation(self, tenant, shared, user):
            if len(self.convs) < 6:
                self.convs.append((b"t%d" % tenant, SYSTEM[:shared] + user))

        @rule(data=st.data(), new=st.integers(1, 8), k=st.sampled_from([3, 2, 0, 1]))
        @rec
        def turn(self, data, new, k):
            self._turn(data, new, k)

        @rule(data=st.data(), new=st.integers(1, 8), k=st.sampled_from([3, 2, 0, 1]))
        @rec
        def follow_up(self, data, new, k):
            """A second rule name for a turn: turns are what everything else acts on."""
            self._turn(data, new, k)

        def _turn(self, data, new, k):
            idx = data.draw(st.lists(st.integers(0, len(self.convs) - 1), min_size=1,
                                     max_size=3, unique=True))
            user = data.draw(st.lists(st.integers(0, 15), min_size=0, max_size=4))
            self._turn_on(idx, user, new, k)

        def _turn_on(self, idx, user, new, k):
            self.eng.spec.k = k
            prompts = [self.convs[i][1] + user for i in idx]
            outs = self._generate(prompts, new, [self.convs[i][0] for i in idx])
            for i, p, out in zip(idx, prompts, outs):
                self.convs[i] = (self.convs[i][0], p + out)

        def _peek(self, i):
            salt, toks = self.convs[i]
            plan = self.cache.lookup("fuzz-peek", toks, salt)
            self.cache.free("fuzz-peek")
            return plan

        @precondition(lambda self: self.fs is not None)
        @rule(i=st.integers(0, 5), toks=st.lists(st.integers(0, 255), min_size=20,
                                                 max_size=48), new=st.integers(1, 4))
        @rec
        def evict_then_resume(self, i, toks, new):
            """Floods until conversation i's longest checkpoint left memory (spilled), then
            its next turn (which may resume from the disk tier)."""
            i %= len(self.convs)
            base = self._peek(i).reuse_tokens
            for j in range(12 if base else 0):
                self._generate([[(t + 53 * j) % 256 for t in toks]], 1, [b"flood"])
                if self._peek(i).reuse_tokens < base:
                    seen["effect:evicted"].add(self.ex)
                    break
            self._turn_on([i], [], new, 0)

        @rule(toks=st.lists(st.integers(0, 255), min_size=20, max_size=48),
              count=st.integers(1, 6))
        @rec
        def flood(self, toks, count):
            """Capacity pressure: ``count`` unrelated prompts, one after the other."""
            for i in range(count):
                self._generate([[(t + 41 * i) % 256 for t in toks]], 2, [b"flood"])

        @precondition(lambda self: self.fs is not None)
        @rule(kind=st.sampled_from(["damage_files", "fail_reads"]),
              mode=st.sampled_from(fuzzdisk.DAMAGE), pick=st.integers(0, 1 << 20),
              n=st.integers(1, 4))
        @rec
        def disk_fault(self, kind, mode, pick, n):
            seen["rule:" + kind].add(self.ex)
            if kind == "fail_reads":
                self.fs.fail_next_reads(n)
            elif self.fs.damage(mode, pick, n):
                seen["effect:file_damaged"].add(self.ex)

        @rule(kind=st.sampled_from(["relocate_graph", "relocate_cached", "bump_version",
                                    "spill_all"]), pick=st.integers(0, 1 << 20))
        @rec
        def perturb(self, kind, pick):
            seen["rule:" + kind].add(self.ex)
            if kind == "relocate_graph":
                self.eng.graph.relocate()
            elif kind == "relocate_cached":      # compaction of a cached block
                cached = [(pk, b) for pk, bs in sorted(self.cache.evictor.cached.items())
                          for b in sorted(bs)]
                if cached:
                    (kind_, group), b = cached[pick % len(cached)]
                    self.cache.relocate(kind_, group, b)
            elif kind == "bump_version":
                self.cache.bump_indexer_version()
            elif self.fs is not None:
                self.cache.spill_all(10.0)

        @invariant()
        @rec
        def cache_ok(self):
            if not hasattr(self, "cache"):
                return
            fuzzcheck.check_state(self.cache, self.legit)

    return EngineMachine


def run(examples, bug=None, steps=20, tick=None, seed=None, shrink=True):
    counter, first, t0, seen = [0], {}, time.time(), defaultdict(set)
    with bugs.seeded(bug) as engine_cls:
        return _run(examples, engine_cls, steps, tick, seed, shrink, counter, first, t0, seen)


def _run(examples, engine_cls, steps, tick, seed, shrink, counter, first, t0, seen):
    cls = make_machine(engine_cls, counter, tick, (first, t0), seen)
    from hypothesis import Phase
    phases = [p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]
    s = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                 suppress_health_check=list(HealthCheck), derandomize=seed is not None,
                 database=None, print_blob=False, phases=phases,
                 report_multiple_bugs=False)
    trace, failures, error = "", 0, ""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            run_state_machine_as_test(cls, settings=s)
    except Exception as e:                                  # noqa: BLE001 (report, not crash)
        failures = 1
        error = f"{type(e).__name__}: {e}"
        notes = "\n".join(getattr(e, "__notes__", ()))      # hypothesis' falsifying steps
        trace = buf.getvalue() + notes + f"\n{error}"
    rules = {k[5:]: len(v) for k, v in sorted(seen.items()) if k.startswith("rule:")}
    effects = {k[7:]: len(v) for k, v in sorted(seen.items()) if k.startswith("effect:")}
    return FuzzResult(counter[0], failures, round(time.time() - t0, 3), trace,
                      round(first.get("t", -1.0), 3), error, rules, effects)


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
