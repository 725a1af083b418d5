"""Arena blocks of several pages (``CacheManager(num_pages=N, block_pages={pool: k})``): an
engine with one id per page-sized unit (vLLM: a window page spans W'/block_size KV block ids)
gets k distinct pages per block of that pool, owned by the pool while the block is held and
given back together; admission and ``available_blocks`` count pages; invariants hold and the
capacity comes back whole under a random run."""
import random

import pytest

from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused, BadArgument
from hybridkv.layout import LayerGroup, ModelLayout
from spec.common import FREE
from tests.cache.helpers import commit_all

BS, W = 4, 12                                       # a window page spans 3 blocks of 4 tokens
LAY = ModelLayout([LayerGroup("g0", "full", (0,), BS, 0, head_dim=1),
                   LayerGroup("g1", "swa", (1,), BS, W, head_dim=1)], name="pages")
K = {("swa", "g1"): W // BS}


def mk(pages, block_pages=K, **kw):
    return CacheManager(LAY, num_pages=pages, device="meta", checked=True,
                        block_pages=block_pages, **kw)


def held(m):
    """page -> pool key of every page a non-FREE block holds (each page once)."""
    out = {}
    for pk, pool in m.pools.items():
        for b, rec in enumerate(pool.recs):
            if rec.st != FREE:
                for page in m.slot_pages(pool.slot(b)):
                    assert page not in out, ("page held twice", page)
                    out[page] = pk
    return out


def test_a_window_block_holds_its_k_pages():
    m = mk(64)
    m.lookup("a", list(range(30)))
    m.allocate("a", 30)
    swa = [s for s in m.tables("a")["g1"].swa if s >= 0]
    assert swa and all(len(m.slot_pages(s)) == 3 for s in swa)
    assert all(m.slot_pages(s) == [s] for s in m.tables("a")["g0"].comp)
    pages = held(m)
    assert sum(pk == ("swa", "g1") for pk in pages.values()) == 3 * m.stats()["pools"][
        "swa/g1"]["writing"]
    assert m.available_blocks()[("comp", "g0")] == 64 - len(pages)
    m.check_invariants()


def test_admission_counts_pages_and_a_refusal_changes_nothing():
    tokens = list(range(24))                        # 6 full blocks + 2 pages (+ snapshots)
    m1 = mk(16, block_pages=None)
    m1.lookup("a", tokens)
    m1.allocate("a", 24)                            # fits at one page per window block
    m = mk(16)
    m.lookup("a", tokens)
    before = (m.available_blocks(), m.stats()["pools"])
    with pytest.raises(AdmissionRefused) as err:
        m.allocate("a", 24)
    total, avail = err.value.value["arena"]
    assert total > avail == 16
    assert (m.available_blocks(), m.stats()["pools"]) == before
    m.check_invariants()


def test_bad_block_pages_are_refused():
    with pytest.raises(BadArgument) as err:
        mk(16, block_pages={("swa", "nope"): 2})
    assert err.value.value == {("swa", "nope"): 2}
    with pytest.raises(BadArgument):
        mk(16, block_pages={("swa", "g1"): 0})
    with pytest.raises(BadArgument):
        CacheManager(LAY, num_blocks=16, device="meta", block_pages=K)


def test_a_random_run_keeps_the_invariants_and_gives_every_page_back():
    rng = random.Random(7)
    m, live = mk(48), []
    prompts = [[rng.randrange(6) for _ in range(rng.randrange(5, 40))] for _ in range(12)]
    for step in range(60):
        if live and (rng.random() < 0.4 or len(live) > 3):
            m.free(live.pop(rng.randrange(len(live))))
        else:
            rid, toks = f"r{step}", rng.choice(prompts) + [step % 6]
            plan = m.lookup(rid, toks)
            try:
                commit_all(m, rid, m.allocate(rid, len(toks) - plan.reuse_tokens))
                live.append(rid)
            except AdmissionRefused:
                m.free(rid)
        m.check_invariants()
    for rid in live:
        m.free(rid)
    m.check_invariants()
    assert m.available_blocks()[("comp", "g0")] == 48       # evictable + free: every page


def test_the_spec_page_rule_counts_a_block_s_k_pages():
    from spec.arena import block_pages_ok
    from spec.common import READY
    assert block_pages_ok(READY, 3, 3) and block_pages_ok(FREE, 0, 3)
    assert not block_pages_ok(READY, 1, 3) and not block_pages_ok(FREE, 3, 3)
