"""Replay through the real runtime: `hk.CacheManager` behind the `sim.replay` seam.

`RuntimeManager(layout, capacity_blocks)` serves each request as the engine would: lookup of the
request's token ids (from `traces.request_token_ids`, salted by tenant), allocate the uncached
rest, commit it, free. Only `--layout v4-mini` maps onto the runtime (hybridkv has no dense
group kind): it uses `ModelLayout.v4_mini(block_size=512)` and gives every pool
`capacity_blocks` blocks, so its bytes are not the simulators' byte budget (a rough match only).
Token expansion is done outside the timed `serve` (cached per request), so ops/s counts the
manager's lookup + allocate + commit + free alone. An AdmissionRefused allocation counts the
request as a miss and frees it.
"""
from __future__ import annotations

import itertools

from hybridkv.bench.layouts import LayoutCost
from hybridkv.bench.managers import Served


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

    def __init__(self, layout: LayoutCost, capacity_blocks: int, tokens: dict | None = None):
        import hybridkv as hk
        self.hk = hk
        self.rlayout = runtime_layout(layout)
        self.mgr = hk.CacheManager(self.rlayout, num_blocks=max(int(capacity_blocks), 1),
                                   device="cpu")
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
