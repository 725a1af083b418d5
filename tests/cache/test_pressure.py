"""Correct under pressure (issue 14): the seven reproductions, written against the public API
only (hk.CacheManager / hk.Engine / stats() / check_invariants()), so they read the same on any
version of the runtime; each failed on the runtime before this change."""
import pytest

import hybridkv as hk

LAY = hk.ModelLayout.v4_mini()
P40 = [(7 * i + 3) % 250 for i in range(40)]


def serve(m, rid, tokens, chunk=None, decode=()):
    """lookup + allocate + commit (commits end on the allocation's checkpoints) + free."""
    plan = m.lookup(rid, tokens)
    L, n = plan.reuse_tokens, len(tokens)
    while L < n:
        step = n - L if chunk is None else min(chunk - L % chunk, n - L)
        a = m.allocate(rid, step)
        for P in [p for p in getattr(a, "checkpoints", ()) if L < p < L + step] + [L + step]:
            m.commit(rid, P - L)
            L = P
    for t in decode:
        a = m.allocate(rid, 1)
        m.commit(rid, 1, [t])
    m.free(rid)
    return plan


def capacity_intact(m):
    """With no request live, every block is free or evictable."""
    s = m.stats()
    assert s["requests"] == 0
    return {name: p["free"] + p["evictable"] == p["blocks"] for name, p in s["pools"].items()}


def test_1_same_checkpoint_computed_twice_leaks_nothing():
    m = hk.CacheManager(LAY, num_blocks=16, checked=True)
    for i in range(40):
        allocs = {}
        for rid in (f"x{i}", f"y{i}"):      # both miss, both compute the same checkpoints
            allocs[rid] = m.allocate(rid, 40 - m.lookup(rid, P40).reuse_tokens)
        for rid, a in allocs.items():
            L = a.start
            for P in [p for p in getattr(a, "checkpoints", ()) if L < p < a.end] + [a.end]:
                m.commit(rid, P - L)
                L = P
            m.free(rid)
    assert all(capacity_intact(m).values()), m.stats()["pools"]
    serve(m, "f1", [1] * 40)
    serve(m, "f2", [2] * 40)               # two fresh requests fit, as in a fresh manager
    m.check_invariants()


def test_1b_repeats_of_one_prompt_keep_every_block():
    """1000 repeats of one prompt on 16 blocks per pool: free + evictable == total."""
    m = hk.CacheManager(LAY, num_blocks=16)
    for i in range(1000):
        serve(m, f"r{i}", P40, chunk=8)
    assert all(capacity_intact(m).values()), m.stats()["pools"]
    m.check_invariants()


@pytest.mark.parametrize("swa_blocks", [3, 4, 5, 6])
def test_2_end_checkpoint_survives_window_pressure(swa_blocks):
    """Chunks of 8, every_n=16, two decode steps, on tiny window pools: the request is either
    refused (its window pages do not fit: nothing changed) or served, and then its end
    checkpoint (42) is what the continuation resumes at -- never lost to a reused block."""
    sizes = {pk: (swa_blocks if pk[0] == "swa" else 48) for pk in LAY.pool_keys()}
    m = hk.CacheManager(LAY, num_blocks=sizes, every_n=16)
    try:
        serve(m, "a", P40, chunk=8, decode=[5, 6])
    except hk.AdmissionRefused:
        assert swa_blocks < 5                  # pages for positions [L-9, L+8) + snapshots
        return
    plan = m.lookup("b", P40 + [5, 6, 7, 8])
    assert plan.reuse_tokens == 42, plan.rejections[:3]


@pytest.mark.parametrize("blocks,every_n", [(8, 0), (10, 0), (12, 0), (8, 16), (12, 16)])
def test_3_eviction_keeps_prefixes_whole(blocks, every_n):
    """A flood of a new prompt on small pools evicts leaves before their ancestors and what no
    lookup can reach first: a prefix loses its deepest checkpoints, never a middle block
    (no checkpoint is left behind a missing chain block)."""
    m = hk.CacheManager(LAY, num_blocks=blocks, every_n=every_n)
    A, B = P40, [(11 * i + 5) % 250 for i in range(40)]
    serve(m, "b0", B)
    serve(m, "a0", A)
    for i in range(3):
        assert serve(m, f"a{i + 1}", A + [i]).reuse_tokens == 40
    serve(m, "new", [(13 * i + 1) % 250 for i in range(40)])
    for rid, prompt in (("qa", A), ("qb", B)):
        plan = m.lookup(rid, prompt + [9])
        broken = [r for r in plan.rejections if r.check == "missing" and
                  r.reason.split()[0] in ("comp", "idx") and int(r.reason.split()[2]) < r.H]
        assert not broken, plan.rejections
        m.free(rid)
    m.check_invariants()


def _engine(cache, **kw):
    return hk.Engine(hk.V4Mini(seed=0), cache, **kw)


def test_4_engine_survives_a_request_that_can_never_fit():
    cache = hk.CacheManager(LAY, num_blocks=4)        # a 3-token prompt fits, 30 tokens never
    eng = _engine(cache)
    big, small = [i % 250 for i in range(300)], [1, 2, 3]
    outs = eng.generate([big, small], 2)
    assert outs[1] and len(outs[1]) == 2                  # the rest of the batch is served
    assert eng.last_outputs[0].error is not None          # the refusal is reported, named
    assert isinstance(eng.last_outputs[0].error, hk.AdmissionRefused) or \
        type(eng.last_outputs[0].error).__name__ == "CannotSchedule"
    assert cache.stats()["requests"] == 0                 # everything it held released
    assert eng.generate([small], 1)[0]                    # the engine stays usable
    assert _engine(cache).generate([small], 1)[0]         # and so does the cache


def test_5_max_running_holds():
    cache = hk.CacheManager(LAY, num_blocks=64)
    eng = _engine(cache, max_running=1)
    peak, lookup = [0], cache.lookup

    def counting(*a, **kw):
        out = lookup(*a, **kw)
        peak[0] = max(peak[0], cache.stats()["requests"])
        return out
    cache.lookup = counting
    eng.generate([[i, i + 1, i + 2] for i in range(5)], 3)
    assert peak[0] == 1


@pytest.mark.parametrize("make", [
    lambda: hk.CacheManager(None),
    lambda: hk.CacheManager("v4-mini"),
    lambda: hk.CacheManager(LAY, device="nodev"),
    lambda: hk.CacheManager(LAY, num_blocks=0),
    lambda: _engine(hk.CacheManager(LAY), max_running=0),
    lambda: _engine(hk.CacheManager(LAY), num_draft_tokens=-1),
    lambda: _engine(hk.CacheManager(LAY)).generate(None, 2),
    lambda: _engine(hk.CacheManager(LAY)).generate([[1, 2]], -1),
])
def test_6_constructors_raise_named_errors(make):
    with pytest.raises(Exception) as e:
        make()
    assert type(e.value).__module__ == "hybridkv.errors" or \
        type(e.value).__name__ in ("LayoutError", "BadArgument", "BadTokens")
    assert hasattr(e.value, "value")


def test_7_identical_prompt_hits_on_its_first_repeat():
    m = hk.CacheManager(LAY, num_blocks=48)
    serve(m, "a", P40)
    assert serve(m, "b", P40).reuse_tokens == 38
