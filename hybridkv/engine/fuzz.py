"""End-to-end stateful fuzzing of the engine (hypothesis): random multi-tenant, multi-turn
conversations with shared prefixes, plus cache floods (evictions, preemptions), indexer version
bumps, draft settings and pool relocations.  After every generation each output must equal a
cold recompute with the same chunking, the model checkpoint store must hold nothing beyond
committed tokens, and ``cache.check_invariants()`` must hold.

``make_machine(bug=None)`` returns the RuleBasedStateMachine class (``bug`` seeds an engine
bug, see hybridkv.engine.engine.BUGS); ``run(examples, bug=None)`` runs it and reports."""
import contextlib
import io
import sys
import time
from typing import NamedTuple

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

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


def _drafter():
    from hybridkv.engine import NgramDrafter

    class FuzzDrafter(NgramDrafter):
        """n-gram drafts, else the last token repeated: drafts on (nearly) every step."""

        def propose(self, tokens):
            return super().propose(tokens) or [tokens[-1]] * self.k

    return FuzzDrafter(8)


def make_machine(bug=None, counter=None, tick=None, first=None):
    import functools

    import hybridkv as hk
    from hybridkv.engine import Engine, cold_mismatches

    def rec(fn):
        """Record when the first failure happened (before hypothesis starts shrinking)."""
        @functools.wraps(fn)
        def wrapped(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception:
                if first is not None:
                    first[0].setdefault("t", time.time() - first[1])
                raise
        return wrapped

    class EngineMachine(RuleBasedStateMachine):
        @initialize(blocks=st.integers(28, 64), k=st.integers(0, 3), chunk=st.sampled_from([4, 8]))
        def setup(self, blocks, k, chunk):
            if counter is not None:
                counter[0] += 1
                if tick:
                    tick()
            self.cache = hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=blocks)
            self.eng = Engine(model(), self.cache, chunk=chunk, num_draft_tokens=k,
                              max_running=3, bug=bug, drafter=_drafter())
            self.convs = []          # (salt, tokens so far)

        @rule(tenant=st.integers(0, 2), shared=st.integers(0, 24),
              user=st.lists(st.integers(0, 15), min_size=1, max_size=8))
        def new_conversation(self, tenant, shared, user):
            if len(self.convs) < 6:
                self.convs.append((b"t%d" % tenant, SYSTEM[:shared] + user))

        @precondition(lambda self: self.convs)
        @rule(data=st.data(), new=st.integers(1, 8), k=st.sampled_from([3, 2, 0, 1]))
        @rec
        def turn(self, data, new, k):
            idx = data.draw(st.lists(st.integers(0, len(self.convs) - 1), min_size=1,
                                     max_size=3, unique=True))
            user = data.draw(st.lists(st.integers(0, 15), min_size=0, max_size=4))
            self.eng.spec_k = k
            prompts = [self.convs[i][1] + user for i in idx]
            outs = self.eng.generate(prompts, new, salts=[self.convs[i][0] for i in idx])
            for i, o, out in zip(idx, self.eng.last_outputs, outs):
                bad = cold_mismatches(model(), o)
                assert bad == 0, f"{bad} tokens differ from the cold run (conv {i})"
                assert o.reused_tokens <= sum(h.reuse_tokens for h in o.hits)
                self.convs[i] = (self.convs[i][0], list(o.prompt) + out)

        @rule(toks=st.lists(st.integers(0, 255), min_size=20, max_size=48))
        @rec
        def flood(self, toks):
            o = self.eng.generate([toks], 2, salts=[b"flood"])[0]
            assert cold_mismatches(model(), self.eng.last_outputs[0]) == 0, o

        @rule()
        def bump_version(self):
            self.cache.bump_indexer_version()

        @rule(extra=st.integers(1, 16))
        def relocate(self, extra):
            self.eng.graph.relocate(extra)

        @invariant()
        @rec
        def cache_ok(self):
            if hasattr(self, "cache"):
                self.cache.check_invariants()
                for e in self.eng.store.entries.values():     # nothing past committed tokens
                    assert e.schedule[-1][1] == e.H and e.ckpt.H == e.H

    return EngineMachine


def run(examples, bug=None, steps=20, tick=None, seed=None, shrink=True):
    counter, first, t0 = [0], {}, time.time()
    cls = make_machine(bug, counter, tick, (first, t0))
    from hypothesis import Phase
    phases = [p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]
    s = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                 suppress_health_check=list(HealthCheck), derandomize=seed is not None,
                 database=None, print_blob=False, phases=phases,
                 report_multiple_bugs=False)
    trace, failures = "", 0
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            run_state_machine_as_test(cls, settings=s)
    except Exception as e:                                  # noqa: BLE001 (report, not crash)
        failures = 1
        notes = "\n".join(getattr(e, "__notes__", ()))      # hypothesis' falsifying steps
        trace = buf.getvalue() + notes + f"\n{type(e).__name__}: {e}"
    return FuzzResult(counter[0], failures, round(time.time() - t0, 3), trace,
                      round(first.get("t", -1.0), 3))


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
