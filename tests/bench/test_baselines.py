"""LRU and Belady against brute-force references; Belady bounds every policy (the simulator's
included: it stays as the reference the runtime replay is compared with)."""
import functools
import random

import pytest

from hybridkv.bench.baselines import CapacityError, LRUPrefixCache, belady, flatten
from hybridkv.bench.layouts import FULL, V4_MINI
from hybridkv.bench.managers import LRUManager, PolicyManager
from hybridkv.bench.replay import replay
from hybridkv.bench.traces import Request, Trace, synthetic_trace
from hybridkv.policy import LRUPolicy


def _random_chained(rng, n_req, vocab_roots=3, depth=5):
    """Prefix-chained requests: a key is the tuple of its path, so chaining is consistent."""
    out = []
    for _ in range(n_req):
        n = rng.randint(1, depth)
        path = [rng.randrange(vocab_roots)]
        for _ in range(n - 1):
            path.append(rng.randrange(2))
        out.append([tuple(path[: i + 1]) for i in range(n)])
    return out


def _lru_reference(reqs, cap):
    """Stamp-based LRU: evict the smallest (last request index, -position) not in use."""
    stamp = {}
    hits = 0
    for t, keys in enumerate(reqs):
        h = 0
        for k in keys:
            if k not in stamp:
                break
            h += 1
        hits += h
        cur = set(keys)
        placed = []
        for k in keys:
            if k in stamp:
                placed.append(k)
                continue
            if len(stamp) >= cap:
                free = [x for x in stamp if x not in cur]
                if not free:
                    continue
                del stamp[min(free, key=stamp.get)]
            stamp[k] = None
            placed.append(k)
        for pos, k in enumerate(placed):
            stamp[k] = (t, -pos)
    return hits


def _opt_reference(acc, cap):
    @functools.lru_cache(maxsize=None)
    def best(i, cache):
        if i == len(acc):
            return 0
        k = acc[i]
        if k in cache:
            return 1 + best(i + 1, cache)
        opts = [best(i + 1, cache)]                       # bypass
        if len(cache) < cap:
            opts.append(best(i + 1, cache | {k}))
        else:
            opts += [best(i + 1, (cache - {v}) | {k}) for v in cache]
        return max(opts)
    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_lru_matches_reference(seed):
    rng = random.Random(seed)
    reqs = _random_chained(rng, rng.randint(3, 25))
    cap = rng.randint(0, 8)
    c = LRUPrefixCache(cap)
    assert sum(c.serve(k) for k in reqs) == _lru_reference(reqs, cap)
    assert len(c) <= cap


@pytest.mark.parametrize("seed", range(40))
def test_belady_matches_brute_force_optimum(seed):
    rng = random.Random(1000 + seed)
    acc = [rng.randrange(5) for _ in range(rng.randint(1, 12))]
    cap = rng.randint(0, 3)
    assert belady(acc, cap).hits == _opt_reference(tuple(acc), cap)


def _as_trace(reqs):
    rs = tuple(Request(i, 512 * len(k), 1, tuple(k)) for i, k in enumerate(reqs))
    return Trace("t", rs, 512)


@pytest.mark.parametrize("seed", range(12))
def test_belady_bounds_ours_and_lru(seed):
    rng = random.Random(seed)
    tr = synthetic_trace(150, seed=seed, tenants=2, active=rng.randint(2, 12))
    acc = flatten(tr.keys(r) for r in tr.requests)
    for cap in (rng.randint(5, 60), rng.randint(60, 400)):
        bound = belady(acc, cap).hits
        for layout in (FULL, V4_MINI):
            for fac in (PolicyManager, LRUManager):
                got = replay(tr, fac(layout, cap), layout)
                assert round(got.block_hit_rate * len(acc)) <= bound


def test_policy_manager_with_lru_policy_equals_lru_baseline():
    tr = synthetic_trace(400, seed=7, active=8)
    for cap in (30, 200, 1000):
        a = replay(tr, PolicyManager(FULL, cap, policy_factory=LRUPolicy), FULL)
        b = replay(tr, LRUManager(FULL, cap), FULL)
        assert a.hit_tokens == b.hit_tokens


def test_bad_capacity_named_error():
    with pytest.raises(CapacityError):
        LRUPrefixCache(-1)
    with pytest.raises(CapacityError):
        belady([1, 2], 1.5)


@pytest.mark.slow
def test_conversation_trace_reference_numbers():
    """The trace README's block-level numbers at 10k blocks (LRU 21.1%, Belady 36.6%)."""
    from hybridkv.bench.shipped import trace_path
    from hybridkv.bench.traces import read_mooncake
    tr = read_mooncake(trace_path("mooncake-conversation"), strict=True)
    lru = replay(tr, LRUManager(FULL, 10000), FULL)
    ours = replay(tr, PolicyManager(FULL, 10000), FULL)
    acc = flatten(tr.keys(r) for r in tr.requests)
    b = belady(acc, 10000)
    assert abs(lru.block_hit_rate - 0.211) < 0.005
    assert abs(b.hits / b.accesses - 0.366) < 0.002
    assert lru.block_hit_rate < ours.block_hit_rate <= b.hits / b.accesses


def test_oracles_bounded_by_belady_and_ordered():
    """Knowing the future inside the same manager: never above Belady; knowing whether a block
    returns beats the online policy and LRU on a multi-turn trace; noise only loses."""
    from hybridkv.bench.oracle import UnknownOracleError, oracle_factory
    tr = synthetic_trace(600, seed=2)
    acc = flatten(tr.keys(r) for r in tr.requests)
    cap = 120
    bound = belady(acc, cap).hits
    got = {w: replay(tr, oracle_factory(tr, w)(FULL, cap), FULL) for w in ("next_use", "reuse")}
    noisy = replay(tr, oracle_factory(tr, "reuse", unflagged=0.5)(FULL, cap), FULL)
    lru = replay(tr, LRUManager(FULL, cap), FULL)
    ours = replay(tr, PolicyManager(FULL, cap), FULL)
    for r in list(got.values()) + [noisy]:
        assert round(r.block_hit_rate * len(acc)) <= bound
    assert got["reuse"].hit_tokens > max(ours.hit_tokens, lru.hit_tokens)
    assert got["reuse"].hit_tokens > noisy.hit_tokens
    with pytest.raises(UnknownOracleError):
        oracle_factory(tr, "crystal-ball")


def test_engine_rule_counts_what_an_engine_can_reuse():
    """An identical repeat: counted block by block the whole prompt hits; under the engine rule
    (whole blocks, the last prompt token always computed) only (n - 1) // 512 blocks do."""
    from hybridkv.bench.baselines import engine_rule_bound
    rs = (Request(0, 1300, 1, (1, 2, 3)), Request(1, 1300, 1, (1, 2, 3)),
          Request(2, 1024, 1, (1, 2)))
    tr = Trace("t", rs, 512)
    blocks = replay(tr, LRUManager(FULL, 100), FULL)
    engine = replay(tr, LRUManager(FULL, 100, engine_rule=True), FULL)
    assert blocks.hit_tokens == 1300 + 1024
    assert engine.hit_tokens == 1024 + 512
    assert engine_rule_bound(tr) == (1024 + 512) / (1300 + 1300 + 1024)


def test_runtime_reaches_the_engine_bound_when_capacity_is_ample():
    """With room for everything the real manager reuses exactly what the engine rule allows."""
    from hybridkv.bench.baselines import engine_rule_bound
    from hybridkv.bench.runtime import RuntimeManager
    tr = synthetic_trace(60, seed=3, tenants=2)
    lengths = [r.input_length for r in tr.requests]
    ours = replay(tr, RuntimeManager("full", 10_000, max(lengths)), FULL)
    assert ours.hit_rate == pytest.approx(engine_rule_bound(tr), abs=1e-12)
    assert ours.hit_rate > 0
