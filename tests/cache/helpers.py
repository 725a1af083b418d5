"""Shared by the cache tests: the V4-mini layout, a 40-token prompt, one request served start
to finish the way an engine does it (commits split at the allocation's checkpoints), a
fingerprint of the whole cache state for "changed nothing" checks, and a FilteredLRU policy
recording what it is told is written and not kept (also the simulator's tests)."""
from hybridkv.cache import CacheManager
from hybridkv.cache.index import extend_chain, root_key
from hybridkv.layout import ModelLayout
from hybridkv.policy import FilteredLRUPolicy

LAY = ModelLayout.v4_mini()
P40 = [(7 * i + 3) % 250 for i in range(40)]


def mk(n=48, **kw):
    kw.setdefault("checked", True)
    return CacheManager(LAY, num_blocks=n, **kw)


def commit_all(m, rid, a, upto=None):
    """Commit an allocation up to ``upto`` (its end), ending a commit on every checkpoint."""
    end = a.end if upto is None else upto
    L = a.start
    for P in list(a.checkpoints) + [end]:
        if L < P <= end:
            m.commit(rid, P - L)
            L = P


def run(m, rid, tokens, salt=b"", decode=(), free=True):
    """lookup + allocate + commit (+ decode steps) + free; returns the plan."""
    plan = m.lookup(rid, tokens, salt=salt)
    commit_all(m, rid, m.allocate(rid, len(tokens) - plan.reuse_tokens))
    m.begin_read(rid)
    for t in decode:
        commit_tokens(m, rid, [t])
    if free:
        m.free(rid)
    return plan


def commit_tokens(m, rid, toks):
    a = m.allocate(rid, len(toks))
    L = a.start
    for P in list(a.checkpoints) + [a.end]:
        if L < P:
            m.commit(rid, P - L, toks[L - a.start:P - a.start])
            L = P


def exact_block(m, kind, group, H, tokens, salt=b""):
    """Block of the exact (snapshot) object of (kind, group) at H for this prompt."""
    keys = extend_chain([], root_key(LAY, salt), tokens, LAY.granule)
    return m.index.exact_block(kind, group, keys[H // LAY.granule - 1])


def fingerprint(m):
    """Everything a call could change: records, slots, free lists, index, policies, requests."""
    pools = {pk: (tuple(p.recs), tuple(p.phys), p.n_free, tuple(p.abi_of))
             for pk, p in m.pools.items()}
    index = ({pk: dict(d) for pk, d in m.index.chain.items()},
             {pk: dict(d) for pk, d in m.index.exact.items()}, dict(m.index.ckpts))
    ev = m.evictor
    evict = ({pk: set(s) for pk, s in ev.cached.items()},
             {pk: set(s) for pk, s in ev.eligible.items()},
             {pk: (p.clock, {k: (e.prio, e.uses, e.seq) for k, e in p.entries().items()})
              for pk, p in ev.policies.items()})
    reqs = {r: (q.phase, q.num_computed_tokens, q.num_allocated_tokens, q.num_draft_tokens,
                tuple(q.reads), tuple(q.token_ids)) for r, q in m.requests.items()}
    return pools, index, evict, reqs, m.miv, tuple(m.seen.keys) if m.seen else ()


class UnkeptCounting(FilteredLRUPolicy):
    """FilteredLRUPolicy recording each ``unkept(n)`` it is told (``unkept_calls``)."""

    def __init__(self):
        super().__init__()
        self.unkept_calls = []

    def unkept(self, n=1):
        self.unkept_calls.append(n)
        super().unkept(n)
