"""Provisional request-end snapshots under pool pressure.

A request's snapshot at its provisional end is published (others may hit it) and may be
evicted by another request's allocation before the owner supersedes it.  Superseding must
then skip the evicted block (it may already belong to someone else) and must leave a block
that another request pinned in the cache.  Regression: the superseding commit used to fire
``evict`` on a free or re-written block (TransitionRefused) and re-admit foreign blocks into
the eviction policy.
"""
import random

import pytest

import hybridkv as hk


def _interleaved(num_blocks, seed, checked):
    """Round-robin chunked prefill then one-token decode steps of multi-turn conversations
    sharing prefixes; a refused allocation preempts the request (free).  Returns (commits,
    refusals)."""
    rng = random.Random(seed)
    cache = hk.CacheManager(hk.ModelLayout.v4_mini(), num_blocks=num_blocks, checked=checked)
    g = cache.layout.granule
    base = [rng.randrange(256) for _ in range(24 * g)]
    convs = [base[:rng.randrange(4, 24) * g] + [rng.randrange(256) for _ in range(9)]
             for _ in range(4)]
    commits = refusals = 0
    for _turn in range(3):
        live = {}
        for j, seq in enumerate(convs):
            rid = f"t{_turn}c{j}"
            plan = cache.lookup(rid, seq, b"tenant")
            live[rid] = [seq, plan.reuse_tokens, len(seq) + rng.randrange(2, 9)]
        while live:
            for rid in list(live):
                seq, L, end = live[rid]
                if L == len(seq):                   # decode: one new token per step
                    seq.append(rng.randrange(256))
                n = min(len(seq) - L, rng.choice((3, 4, 8)))
                try:
                    a = cache.allocate(rid, n)
                    for P in [p for p in a.checkpoints if L < p < L + n] + [L + n]:
                        cache.commit(rid, P - L, seq[L:P])
                        L = P
                    L -= n
                    commits += 1
                except (hk.AdmissionRefused, hk.StaleRead):
                    refusals += 1
                    cache.free(rid)
                    del live[rid]
                    continue
                live[rid][1] = L + n
                if L + n == end:
                    cache.free(rid)
                    del live[rid]
                cache.check_invariants()
        for seq in convs:
            seq += [rng.randrange(256) for _ in range(rng.randrange(2, 9))]   # next user turn
    return commits, refusals


# (20, 0) and (20, 3) failed before the fix (a pinned snapshot was evicted)
@pytest.mark.parametrize("num_blocks,seed", [(16, 0), (16, 1), (18, 2), (20, 0), (20, 3), (24, 1)])
def test_superseded_snapshots_survive_pressure(num_blocks, seed):
    commits, refusals = _interleaved(num_blocks, seed, checked=False)
    assert commits > 0


def test_superseded_snapshots_checked_mode():
    commits, refusals = _interleaved(20, 0, checked=True)
    assert commits > 0
