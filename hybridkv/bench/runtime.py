"""Replay through the real runtime: `hk.CacheManager` behind the `sim.replay` seam.

`RuntimeManager(layout, capacity_blocks)` serves each request as the engine would: lookup of the
request's token ids (from `traces.request_token_ids`, salted by tenant), allocate the uncached
rest, commit it, free. Only `--layout v4-mini` maps onto the runtime (hybridkv has no dense
group kind): it uses `ModelLayout.v4_mini(block_size=512)`. Pools are sized by `runtime_pool_sizes`:
the byte budget is capacity_blocks x the runtime layout's persistent bytes per 512-token block
(comp + idx chain blocks of every group, as `capacity_blocks` means for the simulator), split
over the pools in the proportions of the manager's one sizing function (`alloc.blocks_needed`)
for a request of the trace's mean length with its checkpoints (every `every_n` tokens, default
two blocks, plus the end), and never below what the longest request needs (admission).
The policy is the default of the simulator (FilteredLRUPolicy, no ghosts: block ids recycle).
Token expansion is done outside the timed `serve` (cached per request), so ops/s counts the
manager's lookup + allocate + commit + free alone. An AdmissionRefused allocation counts the
request as a miss and frees it.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

from hybridkv.bench.layouts import LayoutCost
from hybridkv.bench.managers import Served
from hybridkv.policy import FilteredLRUPolicy

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


class PoolSizing(NamedTuple):
    sizes: dict               # (kind, group) -> num_blocks
    block_nbytes: dict        # (kind, group) -> padded bytes per block
    budget_bytes: int
    bytes: int                # what the sizes hold (> budget only to admit the longest request)
    every_n: int


def block_nbytes(rlayout) -> dict:
    """Padded bytes per pool block (same formula as pools.Pool, without allocating)."""
    from spec.funnel import GPU_BLOCK_ALIGN
    out = {}
    for kind, gname in rlayout.pool_keys():
        g = rlayout.group(gname)
        n = _ITEMSIZE[g.dtype]
        for d in rlayout.block_shape(kind, g):
            n *= d
        out[(kind, gname)] = -(-n // GPU_BLOCK_ALIGN) * GPU_BLOCK_ALIGN
    return out


def _points(rlayout, n_tokens: int, every_n: int) -> list:
    pts = set(range(every_n, n_tokens + 1, every_n)) if every_n else set()
    pts.add(n_tokens - n_tokens % rlayout.granule)
    return sorted(p for p in pts if p > 0)


def runtime_pool_sizes(rlayout, capacity_blocks: int, mean_tokens: int, max_tokens: int,
                       every_n: int | None = None) -> PoolSizing:
    """Per-kind pool sizes from a byte budget (see the module docstring)."""
    from hybridkv.alloc import blocks_needed
    bs = max(g.block_size for g in rlayout.groups)
    every_n = 2 * bs if every_n is None else every_n
    nb = block_nbytes(rlayout)
    unit = sum(nb[(k, g.name)] for g in rlayout.groups for k in ("comp", "idx") if k in g.kinds)
    budget = capacity_blocks * unit
    mean_tokens = max(mean_tokens, rlayout.granule)
    mix = blocks_needed(rlayout, 0, mean_tokens, _points(rlayout, mean_tokens, every_n))
    floor = blocks_needed(rlayout, 0, max_tokens, _points(rlayout, max_tokens, every_n))
    mix_bytes = sum(k * nb[pk] for pk, k in mix.items()) or 1
    sizes = {pk: max(1, floor.get(pk, 0), int(mix.get(pk, 0) * budget / mix_bytes))
             for pk in rlayout.pool_keys()}
    return PoolSizing(sizes, nb, budget, sum(sizes[pk] * nb[pk] for pk in sizes), every_n)


class RuntimeLayoutError(ValueError):
    """The bench layout has no runtime counterpart. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"--manager runtime supports --layout v4-mini only, not {value!r}")
        self.value = value


def runtime_layout(layout: LayoutCost, block_size: int = 512):
    import hybridkv as hk
    if layout.name != "v4-mini":
        raise RuntimeLayoutError(layout.name)
    return hk.ModelLayout.v4_mini(block_size=block_size)


def pretokenize(trace, vocab: int) -> dict:
    """id(request) -> its prompt token ids (done once, outside the timed loop)."""
    from hybridkv.bench.traces import request_token_ids
    return {id(r): request_token_ids(trace, r, vocab) for r in trace.requests}


class RuntimeManager:
    """Contract: `serve(trace, req) -> Served`, hit = the HitPlan's reuse_tokens."""

    def __init__(self, layout: LayoutCost, capacity_blocks: int, tokens: dict | None = None,
                 mean_tokens: int = 16384, max_tokens: int = 131072, every_n: int | None = None,
                 policy_factory=FilteredLRUPolicy):
        import hybridkv as hk
        self.hk = hk
        self.rlayout = runtime_layout(layout)
        self.sizing = runtime_pool_sizes(self.rlayout, max(int(capacity_blocks), 1), mean_tokens,
                                         max_tokens, every_n)
        self.mgr = hk.CacheManager(self.rlayout, num_blocks=self.sizing.sizes, device="cpu",
                                   every_n=self.sizing.every_n, policy_factory=policy_factory)
        self.tokens = tokens if tokens is not None else {}
        self.ids = itertools.count()
        self.refused = 0

    def serve(self, trace, req) -> Served:
        toks = self.tokens.get(id(req))
        if toks is None:
            from hybridkv.bench.traces import request_token_ids
            toks = self.tokens[id(req)] = request_token_ids(trace, req, self.rlayout.vocab)
        rid = next(self.ids)
        m = self.mgr
        plan = m.lookup(rid, toks, salt=req.tenant.encode())
        hit = plan.reuse_tokens
        try:
            m.allocate(rid, len(toks) - hit)
            m.commit(rid, len(toks) - hit)
        except self.hk.AdmissionRefused:
            self.refused += 1
            hit = 0
        m.free(rid)
        bs = trace.block_size
        return Served(hit // bs, hit, dict(plan.group_hits))
