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


def test_a_fork_needs_an_earlier_prompt_that_went_on_past_the_shared_prefix():
    seen = SeenPrefixes()
    seen.remember(["k1", "k2"])
    assert seen.shared(["k1", "k2", "k3"], 3) == 0        # extends k1 k2: no fork
    assert seen.shared(["k1", "x"], 2) == 1               # k1 went on (to k2): a fork
    seen.remember(["k1", "k2", "k3"])
    assert seen.shared(["k1", "k2", "y"], 3) == 2         # now k2 went on too


def test_a_prompt_extending_an_earlier_one_writes_no_fork():
    """A conversation's next turn (A's every token, then more) resumes at A's own
    checkpoints: no fork at A's end, where its repeat point already is."""
    m = mk(forks=True)
    run(m, "a", A[:20])
    m.lookup("b", A)
    m.allocate("b", len(A))
    assert m.requests["b"].shared_tokens == 0
    assert "fork" not in set().union(*m.requests["b"].snapshot_tags.values())


def test_the_least_recently_admitted_keys_are_forgotten_first():
    seen = SeenPrefixes(max_keys=3)
    seen.remember(["a", "b"])
    seen.remember(["c"])
    seen.remember(["a", "d"])          # a is admitted again: b is now the least recent
    assert len(seen) == 3 and "b" not in seen.keys
    assert all(k in seen.keys for k in "acd")


LONG_A = P40 + [(17 * i + 9) % 250 for i in range(24)]              # 64 tokens
LONG_B = LONG_A[:34] + [(11 * i + 5) % 250 for i in range(30)]      # parts from A at 34
LONG_C = LONG_B[:36] + [(13 * i + 7) % 250 for i in range(28)]      # parts from B at 36


def test_the_third_prompt_of_a_family_resumes_where_the_second_parted():
    """B shares 34 tokens with A: past B's branch point (32, the end of the compressed
    chain it extends), inside A's third CSA block (32-48) and second HCA block (32-64), which
    no request cached.  Without forks C, which shares 36 tokens with B, resumes at B's branch
    point; with them at the fork, 34."""
    got = {}
    for forks in (True, False):
        m = mk(forks=forks)
        run(m, "a", LONG_A)
        plan_b = run(m, "b", LONG_B)
        assert plan_b.reuse_tokens == 0 and plan_b.branch == 32
        got[forks] = m.lookup("c", LONG_C).reuse_tokens
        m.check_invariants()
    assert got == {True: 34, False: 32}


def test_a_fork_inside_the_first_block_is_not_written():
    """B parts from A at 10 tokens, below the largest block (32): a fork there would save
    less recompute than a block per hit, for a whole checkpoint's bytes."""
    assert LAY.granule == 2 and max(g.block_size for g in LAY.groups) == 32
    m = mk(forks=True)
    run(m, "a", A)
    m.lookup("b", B)
    m.allocate("b", len(B))
    assert m.requests["b"].shared_tokens == 10
    assert "fork" not in set().union(*m.requests["b"].snapshot_tags.values())
    assert m.lookup("c", C).reuse_tokens == 0
    shorter = mk(forks=8)                   # forks at least 8 tokens in
    run(shorter, "a", A)
    run(shorter, "b", B)
    assert shorter.lookup("c", C).reuse_tokens == 10


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
    assert all(k in m.seen.keys for k in m.requests["b"].chain_keys)   # now its own are in


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


@pytest.mark.parametrize("bad", [-1, "yes", None, 2.0])
def test_forks_must_be_a_bool_or_tokens(bad):
    with pytest.raises(BadArgument) as e:
        mk(forks=bad)
    assert repr(bad) in str(e.value)
