"""What the manager tells its eviction policy: the request's class (lookup ``hint``) on every
entry it leaves cached, and a chain block recomputed past a hit counts as a use of the cached
block holding its key."""
import pytest

import hybridkv as hk
from hybridkv.cache import CacheManager
from hybridkv.errors import BadArgument

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
    tags = sorted(e.meta.tag for e in _policy(m)._e.values())
    assert tags == ["comp", "comp/out3"]


def test_a_block_recomputed_past_the_hit_is_a_use_of_the_cached_one():
    """The same 48 tokens again: the hit stops at 32 (one token is always computed), the
    request recomputes [32, 48) whose key A's cached block holds: that block was demanded."""
    m = CacheManager(LAY, num_blocks=16, device="meta")
    serve(m, "a", A)
    (leaf,) = _policy(m)._e.values()
    assert leaf.uses == 0
    assert serve(m, "b", A) == 32
    assert leaf.uses == 1 and len(_policy(m)) == 1      # B's copy went, A's block stays
    m.check_invariants()


@pytest.mark.parametrize("hint", [None, 3, b"out", "x" * 65])
def test_bad_hint_is_named_and_registers_nothing(hint):
    m = CacheManager(LAY, num_blocks=16, device="meta")
    with pytest.raises(BadArgument) as e:
        m.lookup("r", A, hint=hint)
    assert e.value.value == hint and m.stats()["requests"] == 0
