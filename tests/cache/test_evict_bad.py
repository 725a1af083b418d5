"""``CacheManager.evict``: a cached block whose bytes are known bad (an engine's KV load into
it failed) leaves the cache now with every chain block below it, and no lookup resumes through
it again -- not even once another request recomputes it, when the old blocks below would be
found again under their still-valid keys.  Anything but cached is refused and nothing changes.
``page_owner`` names an arena page's block."""
import pytest

from hybridkv.cache import CacheManager
from hybridkv.errors import BadArgument, Refused
from hybridkv.layout import ModelLayout
from tests.cache.helpers import commit_all, fingerprint

LAY = ModelLayout.full(block_size=4)
PROMPT = list(range(3, 43))                       # 40 tokens: 10 blocks


def serve(m, rid, tokens, free=True):
    plan = m.lookup(rid, tokens)
    commit_all(m, rid, m.allocate(rid, len(tokens) - plan.reuse_tokens))
    if free:
        m.free(rid)
    return plan


def chain(m, tokens):
    """The comp blocks of ``tokens``' chain, in order, as far as the index has them."""
    from hybridkv.cache.index import extend_chain, root_key
    keys = extend_chain([], root_key(LAY, b""), tokens, LAY.granule)
    out = []
    for j in range(len(tokens) // 4):
        b = m.index.chain_block("comp", "full", keys[(j + 1) * 4 // LAY.granule - 1])
        if b is None:
            break
        out.append(b)
    return out


@pytest.mark.parametrize("arena", [False, True])
def test_a_bad_block_goes_with_everything_below_it(arena):
    m = CacheManager(LAY, **({"num_pages": 64} if arena else {"num_blocks": 64}),
                     checked=True)
    serve(m, "a", PROMPT)
    blocks = chain(m, PROMPT)
    assert len(blocks) == 10
    m.evict("comp", "full", blocks[4])
    assert chain(m, PROMPT) == blocks[:4]
    assert m.lookup("b", PROMPT).reuse_tokens == 16
    m.check_invariants()


def test_a_recomputed_block_does_not_bring_back_the_old_blocks_below_it():
    """The hazard: blocks below a bad one keep keys that are valid for the same tokens.  Were
    only the bad block evicted, a request recomputing it would republish its key and a
    lookup would walk on into the old blocks computed from the bad bytes."""
    m = CacheManager(LAY, num_blocks=64, checked=True)
    serve(m, "a", PROMPT)
    old = chain(m, PROMPT)
    m.evict("comp", "full", old[2])
    serve(m, "b", PROMPT[:13])                  # recomputes blocks 2 (and publishes it anew)
    plan = m.lookup("c", PROMPT)
    assert plan.reuse_tokens == 12
    assert not {r.ref.block for r in plan.reads} & set(old[3:])


def test_a_held_block_is_refused_and_nothing_changes():
    m = CacheManager(LAY, num_blocks=64, checked=True)
    serve(m, "a", PROMPT)
    old = chain(m, PROMPT)
    serve(m, "b", PROMPT[:30], free=False)      # b pins blocks 0..6 (hit) and holds them
    before = fingerprint(m)
    with pytest.raises(Refused) as e:
        m.evict("comp", "full", old[5])         # held by b
    assert e.value.value[:3] == ("comp", "full", old[5]) and e.value.value[3] == "pinned"
    with pytest.raises(Refused) as e:
        m.evict("comp", "full", old[1])         # cached? no: b holds it, and 5 below it
    assert fingerprint(m) == before
    m.free("b")
    m.evict("comp", "full", old[5])
    assert chain(m, PROMPT) == old[:5]
    m.check_invariants()


def test_bad_arguments_and_free_blocks_are_named():
    m = CacheManager(LAY, num_blocks=64)
    with pytest.raises(BadArgument):
        m.evict("comp", "full", 64)
    with pytest.raises(BadArgument):
        m.evict("comp", "nope", 0)
    with pytest.raises(Refused) as e:
        m.evict("comp", "full", 0)
    assert e.value.value == ("comp", "full", 0, "free")
    with pytest.raises(BadArgument):
        m.page_owner(0)                          # no arena


def test_page_owner_names_the_block_holding_a_page():
    m = CacheManager(LAY, num_pages=32)
    serve(m, "a", PROMPT)
    blocks = chain(m, PROMPT)
    for b in blocks:
        ref = m.page_owner(m.pools[("comp", "full")].slot(b))
        assert tuple(ref) == ("comp", "full", b)
    used = {m.pools[("comp", "full")].slot(b) for b in blocks}
    free = next(p for p in range(32) if m.page_owner(p) is None)
    assert free not in used
    with pytest.raises(BadArgument):
        m.page_owner(32)
