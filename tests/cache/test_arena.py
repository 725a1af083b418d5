"""One block arena (``CacheManager(num_pages=N)``): one page id space for every kind, a page
retyped only while FREE, capacity moving between kinds through each kind's own eviction, a
refusal that changes nothing, the kernels reading the right bytes (engine outputs equal the
per-pool mode's and cold runs), the invariants under a hypothesis pressure run, and seeded page
bugs caught by checked mode."""
import random

import pytest
import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import initialize, invariant

import hybridkv as hk
from hybridkv.cache import CacheManager
from hybridkv.cache.arena import Arena
from hybridkv.cache.arena_pool import ArenaPool
from hybridkv.engine import Engine, cold_mismatches
from hybridkv.errors import AdmissionRefused, BadArgument, InvariantViolation
from hybridkv.model import SeqWork
from spec.arena import PAGE_OWNED
from spec.common import FREE, WRITING
from tests.cache.helpers import LAY, P40, commit_all, fingerprint, run
from tests.cache.test_stateful_pressure import Pressure

Q = [(11 * i + 5) % 250 for i in range(80)]


def mk(pages=64, **kw):
    kw.setdefault("checked", True)
    return CacheManager(LAY, num_pages=pages, **kw)


def held_pages(m):
    """page -> (pool key, block) of every non-FREE block."""
    out = {}
    for pk, pool in m.pools.items():
        for b, rec in enumerate(pool.recs):
            if rec.st != FREE:
                assert pool.phys[b] not in out, ("page held twice", pool.phys[b])
                out[pool.phys[b]] = (pk, b)
    return out


def arena_state(m):
    a = m.arena
    return fingerprint(m), tuple(a.owner), tuple(a.free), dict(a.pages_held)


def test_one_page_id_space_for_every_kind():
    m = mk(128)
    for i, toks in enumerate((P40, Q[:60], P40[:20] + Q[:30])):
        m.lookup(f"r{i}", toks)
        commit_all(m, f"r{i}", m.allocate(f"r{i}", len(toks)))
    pages = held_pages(m)                   # asserts: no page held by two blocks
    assert len({pk for pk, _ in pages.values()}) == len(m.pools)   # every kind holds pages
    for pk, pool in m.pools.items():
        assert pool.n == 128 and all(t.shape[1] == 128 for t in pool.data.values())
    for rid in ("r0", "r1", "r2"):          # a table slot is the page of a block of that kind
        for g, tabs in m.tables(rid).items():
            for kind, slots in (("comp", tabs.comp), ("idx", tabs.idx), ("swa", tabs.swa)):
                for page in slots:
                    assert page == -1 or pages[page][0] == (kind, g)
            assert tabs.tail == -1 or pages[tabs.tail][0] == ("tail", g)
    assert m.arena.check(m.pools) == []
    s = m.stats()["arena"]
    assert s["free"] + sum(s["used"].values()) == 128 and s["free"] == 128 - len(pages)
    for rid in ("r0", "r1", "r2"):
        m.free(rid)
    m.check_invariants()


def test_pages_change_owner_only_while_free(monkeypatch):
    """Every page's history alternates take / give (never retyped while held); under pressure
    pages do pass from one kind to another."""
    history = {}                        # per page, whatever path (one block or a run) moved it
    take, take_one, give = Arena._own_tops, Arena._own_top, Arena._give_pages

    def took(self, pk, blocks):
        pages = take(self, pk, blocks)
        for page in pages:
            history.setdefault(page, []).append(("take", pk))
        return pages

    def took_one(self, pk, block):
        page = take_one(self, pk, block)
        history.setdefault(page, []).append(("take", pk))
        return page

    def gave(self, pk, pages):
        give(self, pk, pages)
        for page in pages:
            history[page].append(("give", pk))

    monkeypatch.setattr(Arena, "_own_tops", took)
    monkeypatch.setattr(Arena, "_own_top", took_one)
    monkeypatch.setattr(Arena, "_give_pages", gave)
    m = mk(64)
    rng = random.Random(1)
    for i in range(30):
        run(m, f"r{i}", [rng.randrange(250) for _ in range(rng.randrange(6, 40))])
    retyped = 0
    for page, events in history.items():
        assert [e for e, _ in events] == ["take", "give"] * (len(events) // 2) + \
            ["take"] * (len(events) % 2)
        for (e1, pk1), (e2, pk2) in zip(events, events[1:]):
            assert e1 != "take" or pk1 == pk2            # given back by the kind that took it
            retyped += e1 == "give" and pk1 != pk2
    assert retyped > 0
    arena = m.arena
    page = next(p for p in range(64) if arena.page_state[p] == PAGE_OWNED)
    with pytest.raises(InvariantViolation):          # a held page cannot change owner
        arena.give(("swa", "swa") if arena.owner[page] != ("swa", "swa") else ("comp", "csa"),
                   arena.owner_block[page], page)
    m.check_invariants()


def test_capacity_moves_between_kinds():
    """Chain-heavy phases (long distinct prompts) and a snapshot-heavy phase (short extensions
    of one shared base: each leaves an end checkpoint's window and tail snapshots, few new
    chain blocks) pass pages between kinds, beyond what an even per-pool split would allow."""
    m = mk(120, every_n=0)
    rng = random.Random(0)
    base = [rng.randrange(250) for _ in range(64)]
    snap = lambda held: sum(n for (k, _), n in held.items() if k in ("swa", "tail"))  # noqa: E731
    chain = lambda held: sum(n for (k, _), n in held.items() if k in ("comp", "idx"))  # noqa: E731
    phases = []
    for phase in ("chain", "snapshot", "chain"):
        for i in range(24 if phase == "snapshot" else 8):
            toks = base[:rng.randrange(16, 56)] + [rng.randrange(250)] if phase == "snapshot" \
                else [rng.randrange(250) for _ in range(56)]
            run(m, f"{phase}{len(phases)}-{i}", toks)
        phases.append(dict(m.arena.pages_held))
        m.check_invariants()
    (c1, s1), (c2, s2), (c3, s3) = [(chain(h), snap(h)) for h in phases]   # 52/44 44/64 61/35
    assert s2 > s1 and c2 < c1                    # snapshots took pages chain blocks gave back
    assert c3 > c2 and s3 < s2                    # and chain blocks took them back
    assert s2 - s1 >= 16 and c3 - c2 >= 16        # whole requests' worth of pages moved
    even_share = 120 // len(m.pools)               # what a per-pool split of 120 gives: 15
    assert max(phases[2][pk] for pk in m.pools if pk[0] in ("comp", "idx")) > even_share


def test_refused_allocation_changes_nothing_in_arena_mode():
    m = mk(64)
    m.lookup("A", P40)
    commit_all(m, "A", m.allocate("A", 40))
    m.lookup("C", Q)
    before = arena_state(m), m.stats()["arena"], m.kv_bytes_held()
    with pytest.raises(AdmissionRefused) as e:    # its own blocks do not fit, snapshots aside
        m.allocate("C", 100)
    assert "arena" in e.value.value
    assert (arena_state(m), m.stats()["arena"], m.kv_bytes_held()) == before
    m.free("A")                                   # A's blocks cached: pages can be taken back
    commit_all(m, "C", m.allocate("C", 100), upto=len(Q))
    m.free("C")
    m.check_invariants()


def test_num_pages_and_num_blocks_exclude_each_other():
    with pytest.raises(BadArgument):
        CacheManager(LAY, num_blocks=8, num_pages=8)
    with pytest.raises(BadArgument):
        CacheManager(LAY, num_pages=0)
    assert CacheManager.arena_pages(LAY, 40, 2) == sum(
        CacheManager.pool_sizes(LAY, 40, 2).values())


M = hk.V4Mini(seed=0)
SYS = [(7 * i + 3) % 250 for i in range(30)]


MT = hk.V4Mini(seed=0, backend="triton")


def test_the_kernels_read_arena_pages():
    """An arena view's block stride is the page (> rows x dim): the Triton kernels take it as
    a launch argument, so a forward over the arena runs and gives the torch backend's bytes,
    and the per-pool mode's."""
    logits = {}
    for mode, kw in (("pools", dict(num_blocks=64)), ("arena", dict(num_pages=64))):
        for model in (M, MT):
            cache = CacheManager(model.layout(), **kw)
            cache.lookup("a", SYS[:12])
            cache.allocate("a", 12)
            pins = {g.name: cache.launch_pins("a", g.name) for g in cache.layout.groups}
            out = model.forward([SeqWork(SYS[:12], 0, cache.tables("a"), pins, 12)], cache)
            logits[mode, model.backend] = out
    pools = CacheManager(M.layout(), num_blocks=64).layer_pools(0)["swa"]["kv"]
    arena = CacheManager(M.layout(), num_pages=64).layer_pools(0)["swa"]["kv"]
    assert arena.stride(0) > pools.stride(0) == arena.shape[1] * arena.shape[2]
    for backend in ("torch", "triton"):
        assert torch.equal(logits["arena", backend][0], logits["pools", backend][0])
    assert torch.allclose(logits["arena", "triton"][0], logits["arena", "torch"][0], atol=1e-5)


@pytest.mark.parametrize("model", [M, pytest.param(MT, marks=pytest.mark.slow)],
                         ids=["torch", "triton"])   # Triton interpreted: ~30 s, slow tier
def test_engine_in_arena_mode_equals_per_pool_mode_and_cold_runs(model):
    """The arena's tables and views give the model exactly the bytes the per-pool mode does:
    the same tokens, each equal to a cold run's, reuse too, on either backend."""
    prompts = [SYS[:12], SYS[:16] + [9] * 8, SYS[:20], [3] * 14, SYS + [1, 2]]
    outs = {}
    for mode, kw in (("pools", dict(num_blocks=64)), ("arena", dict(num_pages=160))):
        e = Engine(model, CacheManager(model.layout(), checked=True, **kw), max_running=4)
        outs[mode] = e.generate(prompts, 5) + e.generate([SYS + [1, 2, 4]], 4)
        assert e.last_outputs[0].reused_tokens > 0
        assert cold_mismatches(model, e.last_outputs[0]) == 0
        assert e.stats()["launch_refused"] == 0
        e.cache.check_invariants()
    assert outs["arena"] == outs["pools"]


def test_engine_under_arena_pressure_matches_cold_runs():
    e = Engine(M, CacheManager(M.layout(), num_pages=48, checked=True), max_running=4)
    e.generate([SYS[:12], SYS[:16] + [9] * 8, SYS[:20], [3] * 14], 5)
    assert [cold_mismatches(M, o) for o in e.last_outputs] == [0] * 4
    assert e.cache.stats()["arena"]["free"] < 48
    e.cache.check_invariants()


def test_arena_views_alias_each_page_once():
    """Bytes written through a pool's views land in its own page, at its tensor and layer
    offsets, and nowhere in another held page; a spill round trip is exact."""
    m = mk(64)
    run(m, "a", P40, free=False)
    pages = held_pages(m)
    for page, (pk, b) in pages.items():
        for t in m.pools[pk].data.values():
            t[:, page] = float(page)
    for page, (pk, b) in pages.items():
        pool = m.pools[pk]
        raw = m.arena.buffer[page * m.arena.page_nbytes:][:pool.block_nbytes]
        assert torch.equal(pool.to_bytes(b).view(torch.float32),
                           torch.full((pool.staged_nbytes // 4,), float(page)))
        assert raw.view(torch.float32).eq(float(page)).sum() * 4 == pool.staged_nbytes
        pool.from_bytes(b, pool.to_bytes(b))
    m.free("a")
    m.check_invariants()


class ArenaPressure(Pressure):
    """test_stateful_pressure's machine on an arena of 12-48 pages."""

    @initialize(pages=st.integers(12, 48), every=st.sampled_from([0, 8, 16]))
    def setup(self, pages, every):
        self.m = CacheManager(LAY, num_pages=pages, every_n=every, checked=True, check_every=8)
        self.live, self.n = {}, 0

    @invariant()
    def accounting(self):
        super().accounting()
        if hasattr(self, "m") and not self.live:
            evictable = sum(p["evictable"] for p in self.m.stats()["pools"].values())
            assert self.m.arena.n_free + evictable == self.m.arena.num_pages


TestArenaPressure = ArenaPressure.TestCase
TestArenaPressure.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                      suppress_health_check=list(HealthCheck))


def test_seeded_page_given_back_while_held_is_caught(monkeypatch):
    """Negative control: the first block that leaves WRITING gives its page back though it is
    not FREE -- checked mode fails on the page's owner at the end of that very call (before
    anything reuses the page), and the full sweep (Arena.check) names it too."""
    moved, leaked = ArenaPool._moved, []

    def leaky(self, b, old, new):
        moved(self, b, old, new)
        if old == WRITING and new != FREE and not leaked:
            leaked.append((self.key, b))
            self.arena.give(self.key, b, self.phys[b])
    monkeypatch.setattr(ArenaPool, "_moved", leaky)
    m = mk(64)
    with pytest.raises(InvariantViolation) as e:
        run(m, "a", P40)
    assert e.value.value == "pool_integrity" and "page-owner" in str(e.value)
    (pk, b), = leaked
    assert ("page-owner", pk, b, m.pools[pk].phys[b]) in m.arena.check(m.pools)


def test_seeded_page_taken_twice_is_caught(monkeypatch):
    """Negative control: ``take`` hands out a page without popping it from the free list, and
    does not check its owner -- checked mode finds the page held twice / owned while free."""
    def twice(self, pk, b, checked=True):
        page = self.free[-1]
        self.page_state[page], self.owner[page], self.owner_block[page] = PAGE_OWNED, pk, b
        self.pages_held[pk] += 1
        return page
    monkeypatch.setattr(Arena, "take", twice)
    m = mk(64)
    with pytest.raises(InvariantViolation) as e:
        run(m, "a", P40)
    assert "page" in str(e.value)
