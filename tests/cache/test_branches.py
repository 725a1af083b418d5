"""Forks (``CacheManager(forks=True)``, ``SeenPrefixes``): a checkpoint where a prompt parts
from the prompts admitted before it, even inside a compressed block no request has cached, so
the next prompt of the family resumes there.  V4-mini's blocks: window 6, CSA 16, HCA 32
tokens, hash granule 2."""
import pytest

from hybridkv.cache.branches import SeenPrefixes
from hybridkv.errors import AdmissionRefused, BadArgument
from tests.cache.helpers import LAY, P40, fingerprint, mk, run

A = P40
B = P40[:10] + [(11 * i + 5) % 250 for i in range(30)]      # parts from A at 10
C = B[:12] + [(13 * i + 7) % 250 for i in range(28)]        # parts from B at 12, from A at 10


def test_shared_counts_the_leading_keys_an_admitted_prompt_had():
    seen = SeenPrefixes()
    seen.remember(["k1", "k2", "k3"])
    assert seen.shared(["k1", "k2", "x", "k3"], 4) == 2
    assert seen.shared(["k1", "k2", "k3"], 2) == 2          # no further than the limit
    assert seen.shared(["x", "k1"], 2) == 0


def test_the_least_recently_admitted_keys_are_forgotten_first():
    seen = SeenPrefixes(max_keys=3)
    seen.remember(["a", "b"])
    seen.remember(["c"])
    seen.remember(["a", "d"])          # a is admitted again: b is now the least recent
    assert len(seen) == 3 and seen.shared(["b"], 1) == 0
    assert all(seen.shared([k], 1) for k in "acd")


def test_the_third_prompt_of_a_family_resumes_where_the_second_parted():
    """B shares 10 tokens with A, inside A's first CSA block (16): no cached block marks the
    branch, so without the seen keys neither request retains a checkpoint at 10 and C, which
    shares 12 tokens with B, misses."""
    assert LAY.granule == 2 and min(g.block_size for g in LAY.groups if g.kind != "swa") > 10
    m = mk(forks=True)
    run(m, "a", A)
    assert run(m, "b", B).reuse_tokens == 0
    plan = m.lookup("c", C)
    m.check_invariants()
    assert plan.reuse_tokens == 10

    blind = mk()                       # forks off: nothing remembered
    assert blind.seen is None
    run(blind, "a", A)
    run(blind, "b", B)
    assert blind.lookup("c", C).reuse_tokens == 0


def test_a_waiting_request_asked_again_does_not_branch_from_itself():
    """An engine re-asks a waiting request every step: it is remembered when its first
    allocation is admitted, so its own keys never count as another prompt's."""
    m = mk(forks=True)
    run(m, "a", A)
    for _ in range(3):
        m.lookup("b", B)
    assert m.seen.shared(m.requests["b"].chain_keys, 20) == 5      # A's 10 tokens only
    m.allocate("b", len(B))
    assert m.requests["b"].shared_tokens == 10
    assert m.seen.shared(m.requests["b"].chain_keys, 20) == 20     # now its own are in


def test_a_refused_allocation_remembers_nothing():
    m = mk(n=6, forks=True)
    run(m, "a", A[:8])
    m.lookup("b", B + list(range(200)))
    before = fingerprint(m)                   # (the seen keys with the rest)
    with pytest.raises(AdmissionRefused):
        m.allocate("b", len(B) + 200)
    assert fingerprint(m) == before


def test_another_tenant_s_prompts_are_no_branch():
    m = mk(forks=True)
    run(m, "a", A, salt=b"tenant-1")
    run(m, "b", B, salt=b"tenant-2")
    assert m.lookup("c", C, salt=b"tenant-2").reuse_tokens == 0


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_forks_must_be_a_bool(bad):
    with pytest.raises(BadArgument) as e:
        mk(forks=bad)
    assert repr(bad) in str(e.value)
