"""What the manager tells its eviction policy: the request's class (lookup ``hint``) on every
entry it leaves cached, and a chain block recomputed past a hit counts as a use of the cached
block holding its key."""
import pytest

import hybridkv as hk
from hybridkv.cache import CacheManager
from hybridkv.errors import BadArgument
from hybridkv.policy import FilteredLRUPolicy
from tests.cache.helpers import UnkeptCounting

LAY = hk.ModelLayout.full(16, vocab=256)
A = [(5 * i + 1) % 256 for i in range(48)]


def serve(m, rid, tokens, hint=""):
    plan = m.lookup(rid, tokens, hint=hint)
    L = plan.reuse_tokens
    a = m.allocate(rid, len(tokens) - L)
    for P in [q for q in a.checkpoints if L < q < a.end] + [a.end]:
        m.commit(rid, P - L)
        L = P
    m.free(rid)
    return plan.reuse_tokens


def _policy(m):
    return m.evictor.policies[("comp", LAY.groups[0].name)]


def test_hint_files_entries_under_the_request_class():
    m = CacheManager(LAY, num_blocks=16, device="meta")
    serve(m, "a", A, hint="out3")
    serve(m, "b", [9] * 40)
    tags = sorted(e.meta.tag for e in _policy(m).entries().values())
    assert tags == ["comp"] * 2 + ["comp/out3"] * 3      # B's 2 blocks, A's 3


def test_a_block_recomputed_past_the_hit_is_a_use_of_the_cached_one():
    """The same 48 tokens again: the hit stops at 32 (one token is always computed), the
    request recomputes [32, 48) whose key A's cached block holds: that block was demanded."""
    m = CacheManager(LAY, num_blocks=16, device="meta")
    serve(m, "a", A)
    entries = _policy(m).entries()
    leaf = max(entries.values(), key=lambda e: e.meta.flops)    # the block ending at 48
    assert len(entries) == 3 and leaf.uses == 0
    assert serve(m, "b", A) == 32
    assert leaf.uses == 1 and len(entries) == 3     # B's copy went, A's block stays
    m.check_invariants()


@pytest.mark.parametrize("n_tokens, unkept", [(48, []), (40, [1]), (47, [1]), (1, [1])])
def test_a_freed_requests_partial_last_block_is_counted_as_written_and_not_kept(n_tokens,
                                                                                unkept):
    """The one block a free rejects unsealed (the prompt's partial last block) reaches the
    policy as ``unkept``: FilteredLRU's mean is over every block written, as the simulator's
    (which files a partial block as a never-reused entry).  A prompt ending on a block
    boundary leaves none."""
    m = CacheManager(LAY, num_blocks=16, device="meta", policy_factory=UnkeptCounting)
    serve(m, "a", A[:n_tokens])
    policy = _policy(m)
    assert policy.unkept_calls == unkept
    assert policy._n_in == len(policy.entries()) + sum(unkept)   # no entry made for it
    m.check_invariants()


@pytest.mark.parametrize("hint", [None, 3, b"out", "x" * 65])
def test_bad_hint_is_named_and_registers_nothing(hint):
    m = CacheManager(LAY, num_blocks=16, device="meta")
    with pytest.raises(BadArgument) as e:
        m.lookup("r", A, hint=hint)
    assert e.value.value == hint and m.stats()["requests"] == 0


B = [(7 * i + 3) % 256 for i in range(48)]
C = [(11 * i + 2) % 256 for i in range(64)]


def test_eviction_follows_last_use_down_a_chain():
    """A is used, then B; a new prompt needs room.  Victims go in last-use order: A's whole
    chain (leaf first, then the parent it exposes) before any block of B.  A parent that
    becomes a leaf only when its child goes keeps the recency of its last use; before the fix
    it entered the policy as new at that moment and outlived B's blocks."""
    m = CacheManager(LAY, num_blocks=8, device="meta", policy_factory=FilteredLRUPolicy)
    serve(m, "a", A)
    serve(m, "b", B)
    serve(m, "c", C)
    hit_a = m.lookup("qa", A + [1]).reuse_tokens
    hit_b = m.lookup("qb", B + [1]).reuse_tokens
    assert (hit_a, hit_b) == (16, 48)           # two victims: A's blocks ending at 48 and 32
    m.check_invariants()


def test_hint_survives_pin_and_unpin():
    """unpin gives the plan back and keeps the request's class: what it leaves cached later is
    still filed under its hint."""
    m = CacheManager(LAY, num_blocks=16, device="meta")
    serve(m, "a", A)
    H = m.lookup("b", A + [7] * 16, hint="out2").reuse_tokens
    m.pin("b")
    m.unpin("b")
    a = m.allocate("b", 64 - H)
    L = a.start
    for P in [q for q in a.checkpoints if L < q < a.end] + [a.end]:
        m.commit("b", P - L)
        L = P
    m.free("b")
    tags = sorted(e.meta.tag for e in _policy(m).entries().values())
    assert "comp/out2" in tags, tags
