"""TOCTOU at the read: a block the plan named changes before the request reads it.  The
allocation that pins it refuses a stale plan (StaleRead) and every kernel launch re-checks
the pins of the blocks it reads (spec can_read_pinned); either way the engine looks up again
and the output still equals the cold run.  Without both checks (seeded bug stale_reads) the
request reads someone else's block."""
import pytest

import hybridkv as hk
from hybridkv.cache import ObjRef
from hybridkv.engine import Engine, cold_mismatches
from hybridkv.testing import bugs

M = hk.V4Mini(seed=0)
P = [(7 * i + 3) % 250 for i in range(40)]


def warm_cache(blocks, checked=True):
    cache = hk.CacheManager(M.layout(), num_blocks=blocks, checked=checked)
    Engine(M, cache).generate([P], 2)                 # P's prefix cached, checkpoint at 40
    return cache


def test_launch_refuses_a_block_moved_after_the_plan_and_output_stays_cold():
    cache = warm_cache(64, checked=False)
    eng = Engine(M, cache)
    moved, fwd = [], M.forward

    class Racing:
        """Moves one shared block the first resumed request pinned, right before the launch
        (as a buggy compaction would): the launch must refuse it."""
        layout = M.layout

        def forward(self, batch, c):
            for w in batch:
                pins = [pc for g in w.pins.values() for pc in g]
                if pins and not moved:
                    req = next(r for r in c.requests.values() if r.reads)
                    r = next(r for r in req.reads if r.ref.kind == "comp")
                    pool = c.pools[(r.ref.kind, r.ref.group)]
                    rec = pool.recs[r.ref.block]
                    pool.recs[r.ref.block] = rec._replace(ep=rec.ep + 1)   # behind its back
                    moved.append(ObjRef(*r.ref))
            return fwd(batch, c)
    eng.model = Racing()
    out = eng.generate([P + [1, 2, 3]], 4)
    eng.model = M
    assert moved and eng.stats()["launch_refused"] >= 1
    o = eng.last_outputs[0]
    assert o.replans >= 1 and cold_mismatches(M, o) == 0
    assert out == Engine(M, hk.CacheManager(M.layout(), num_blocks=64)).generate(
        [P + [1, 2, 3]], 4)


def _two_in_one_step(engine_cls, blocks=8):
    """B's plan hits P's cached blocks; A, admitted before B in the same step, needs room and
    evicts them before B's allocation pins them."""
    cache = warm_cache(blocks, checked=engine_cls is Engine)
    eng = engine_cls(M, cache, max_running=2, chunk=64)
    a_prompt = [(11 * i + 5) % 250 for i in range(48)]
    outs = eng.generate([a_prompt, P + [9, 9]], 3)
    return eng, outs


def test_plan_evicted_before_the_pin_is_refused_and_replanned():
    eng, outs = _two_in_one_step(Engine)
    assert eng.stats()["replans"] >= 1
    assert [cold_mismatches(M, o) for o in eng.last_outputs] == [0, 0]
    eng.cache.check_invariants()


def _evicted_and_reused(blocks=8):
    """B looks up P (its plan names P's blocks); then request A runs start to finish on a tight
    cache, evicting some of them and publishing its own state into the same slots."""
    from hybridkv.engine.embedding import serve_one
    cache = warm_cache(blocks, checked=False)
    plan = cache.lookup("B", P + [9, 9])
    assert plan.reuse_tokens == 40
    serve_one(M, cache, [(11 * i + 5) % 250 for i in range(48)], b"", 1, rid="A")
    recs = [cache.pools[(r.ref.kind, r.ref.group)].recs[r.ref.block] for r in plan.reads]
    moved = [r for r, rec in zip(plan.reads, recs) if rec.ver != r.ver]
    assert moved, "A did not evict any block of B's plan"
    return cache


def _resume_B(cache, pins):
    """B's first chunk the way an engine runs it; returns its logits."""
    from hybridkv.model import SeqWork
    a = cache.allocate("B", 2)
    w = SeqWork([9, 9], a.start, cache.tables("B"), pins(cache), 2)
    return M.forward([w], cache)[0]


def test_plan_evicted_and_reused_is_refused_at_the_pin():
    cache = _evicted_and_reused()
    with pytest.raises(hk.StaleRead):
        cache.allocate("B", 2)


def test_without_the_pin_check_the_launch_still_refuses():
    from kernels.guards import LaunchRefused
    cache = _evicted_and_reused()
    with bugs.seeded("stale_reads"):                  # CacheManager._check_plan swapped out
        with pytest.raises((LaunchRefused, hk.CacheError)):
            _resume_B(cache, lambda c: {g.name: c.launch_pins("B", g.name)
                                        for g in c.layout.groups})


def test_seeded_bug_stale_reads_reads_someone_elses_block():
    """Both checks gone: B computes from A's bytes -- the cold run says so."""
    from hybridkv.engine import cold_logits
    import torch
    cache = _evicted_and_reused()
    with bugs.seeded("stale_reads"):
        try:
            got = _resume_B(cache, lambda c: {})
            wrong = not torch.equal(got, cold_logits(M, P + [9, 9])[40:42])
        except Exception:                    # a pin of a block being written also fails
            wrong = True
    assert wrong


@pytest.mark.parametrize("bug,msg", [("resume_off_plan", "AssertionError: output mismatch")])
def test_fuzz_finds_seeded_bug(bug, msg):
    from hybridkv.testing import fuzz
    r = fuzz.run(40, bug=bug, steps=10, seed=1, shrink=False)
    assert r.failures == 1 and 0 <= r.find_seconds <= r.seconds, r
    assert r.error.startswith(msg), r.error
