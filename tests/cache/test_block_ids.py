"""A pool hands out one int object per block id (``Pool.ids``): a block id that comes back to
the free list from anywhere -- a policy victim computed by numpy, a run of ids converted from
an array, an id the caller built itself -- goes back as the pool's own object, so the sets and
dicts keyed by block ids (the evictor's, the liveness', the index's) meet the same object they
stored and their probes stop at the identity test instead of comparing two ints."""
import random

import numpy as np

from hybridkv.cache import CacheManager
from hybridkv.layout import ModelLayout


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
    """After evictions (policy victims) and frees, every block id the evictor, the liveness,
    the index and the free list hold -- and every block's ObjRef -- is the pool's object for
    it (a pool past the small-int cache, used through its high ids)."""
    m = CacheManager(ModelLayout.full(block_size=4), num_blocks=600, device="meta",
                     checked=True)
    rng = random.Random(0)
    for i in range(200):
        prompt = [rng.randrange(250) for _ in range(80)]
        a = m.allocate(i, 80 - m.lookup(i, prompt).reuse_tokens)
        m.commit(i, a.end - a.start)
        m.free(i)
    m.check_invariants()
    pk = ("comp", "full")
    pool, ev = m.pools[pk], m.evictor
    stored = [*ev.cached[pk], *ev.admitted[pk], *ev.eligible[pk], *ev.liveness.live[pk],
              *m.index.entries[pk], *m.index.chain[pk].values(), *pool.free]
    assert len([b for b in stored if b > 256]) > 300          # the high ids were used
    assert all(b is pool.ids[b] for b in stored)
    assert all(ref.block is pool.ids[ref.block] for ref in pool.refs)
