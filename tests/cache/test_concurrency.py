"""Lookups, allocations, commits, drafts, frees and evictions from several threads, checked
mode on (every call asserts the invariants under the manager's one lock)."""
import random
import threading

from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused, StaleRead
from tests.cache.helpers import LAY, commit_all

PREFIXES = [[(13 * i + s) % 256 for i in range(48)] for s in range(3)]


def worker(m, tid, n_ops, errors, stats):
    rng = random.Random(tid)
    try:
        for k in range(n_ops):
            rid = f"t{tid}-{k}"
            base = rng.choice(PREFIXES)[: rng.randint(8, 48)]
            prompt = base + [rng.randrange(256) for _ in range(rng.randint(1, 20))]
            plan = m.lookup(rid, prompt, salt=rng.choice([b"", b"x"]))
            try:
                drafts = rng.choice([0, 0, 3])
                a = m.allocate(rid, len(prompt) - plan.reuse_tokens, num_draft_tokens=drafts)
                m.begin_read(rid)
                commit_all(m, rid, a)
                if drafts:
                    if rng.random() < 0.5:
                        m.reject_drafts(rid)
                    else:
                        m.accept_drafts(rid, [rng.randrange(256) for _ in range(3)])
                stats["hits"] += plan.reuse_tokens > 0
            except (AdmissionRefused, StaleRead):
                stats["refused"] += 1
            m.free(rid)
    except Exception as e:          # surfaced by the main thread
        errors.append(repr(e))


def test_threads_keep_every_invariant():
    m = CacheManager(LAY, num_blocks=40, checked=True)
    errors, stats = [], {"hits": 0, "refused": 0}
    threads = [threading.Thread(target=worker, args=(m, t, 25, errors, stats)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    m.check_invariants()
    assert m.requests == {}
    assert all(r.pins == 0 for p in m.pools.values() for r in p.recs)
    assert stats["hits"] > 0
    assert sum(m.metrics.evictions.values()) > 0, "the stress must also evict"
