"""A pool hands out one int object per block id (``Pool.ids``): a block id that comes back to
the free list from anywhere -- a policy victim computed by numpy, a run of ids converted from
an array, an id the caller built itself -- goes back as the pool's own object, so the sets and
dicts keyed by block ids (the evictor's, the liveness', the index's) meet the same object they
stored and their probes stop at the identity test instead of comparing two ints."""
import numpy as np

from hybridkv.cache import CacheManager
from hybridkv.layout import ModelLayout
from tests.cache.helpers import LAY, P40


def _fresh(b):
    """An int equal to ``b`` that is another object (ids past the small-int cache)."""
    return np.asarray([b]).tolist()[0]


def test_a_block_freed_under_another_int_object_comes_back_as_the_pools_own():
    m = CacheManager(ModelLayout.full(block_size=8), num_blocks=600, device="meta")
    pool = m.pools[("comp", "full")]
    assert all(b is pool.ids[b] for b in pool.free)
    blocks = pool.alloc_run(300)                   # ids up to 599: none is a cached small int
    high = [b for b in blocks if b > 256]
    pool.write_run(high, [8] * len(high))
    pool.fire(_fresh(high[0]), "reject")           # one block at a time
    pool.fire_run([_fresh(b) for b in high[1:]], "reject")   # and a run
    assert {b for b in pool.free if b > 256} >= set(high)
    assert all(b is pool.ids[b] for b in pool.free)
    again = pool.alloc_run(len(blocks))
    assert all(b is pool.ids[b] for b in again)


def test_a_served_stream_keeps_every_stored_block_id_the_pools_own():
    """After evictions (policy victims) and frees, every block id the evictor and the index
    hold is the pool's object for it."""
    m = CacheManager(LAY, num_blocks=48, checked=True)
    for i in range(12):
        prompt = [(t + 17 * i) % 250 for t in P40]
        m.lookup(i, prompt)
        a = m.allocate(i, 40 - m.requests[i].plan.reuse_tokens)
        m.commit(i, a.end - a.start)
        m.free(i)
    m.check_invariants()
    for pk, pool in m.pools.items():
        stored = [*m.evictor.cached[pk], *m.evictor.admitted[pk], *m.evictor.eligible[pk],
                  *m.index.entries[pk], *pool.free]
        assert stored and all(b is pool.ids[b] for b in stored), pk
