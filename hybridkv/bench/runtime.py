"""Replay through the real runtime: one `hk.CacheManager` per replay, serving a trace as an engine
would.

Per request (`RuntimeManager.serve`): ``lookup`` of the prompt's token ids (expanded from the
trace's hash ids, salted by tenant), then the uncached rest [H, n) in prefill chunks of
`chunk_tokens` (an engine's chunked prefill: the window pages a chunk writes are released by the
next commit, so a long prompt never holds all its pages at once); each chunk is one ``allocate``
and commits that end on every checkpoint the allocation returns, then on its end; ``free``.
Token expansion happens in ``prepare``, outside the timed call, so ops/s counts the manager
alone. A refused allocation (AdmissionRefused) counts the request as a miss.

Layouts (`runtime_layout`): ``full`` = ``ModelLayout.full(block_size=P)`` (one dense group),
``v4-mini`` = ``ModelLayout.v4_mini(block_size=P, window=128, hca_ratio=128)`` (the bench's
W = 128 and m' = 128; the trace vocabulary).  Pools live on ``device="meta"``: bookkeeping only.
The page P (`page_tokens`) is the trace's block tokens (512 on Mooncake), so a hit keeps every
whole trace block it covers; v4-mini rounds it up to a multiple of m' = 128 (an HCA block must
hold whole compressed entries).

Capacity (`runtime_pool_sizes`): `capacity_blocks` x the layout's chain bytes per 512 tokens
(comp + idx of every chained group) is the byte budget of all pools together, whatever the page;
``unit`` is the chain bytes of one page, so the chain blocks follow from the budget.
It holds first the working objects of the longest request (its pinned chain, one chunk's window
pages, tails and the snapshots of one allocation), then splits the rest between chain units
(one block in each chain pool) and checkpoint sets (the exact objects of a checkpoint at a block
boundary: one block in each snapshot pool, ``ckpt_bytes`` = 3.24 units on v4-mini).

Tuning (`tuned`).  The manager's pools have fixed sizes, so the split cannot follow demand as
the simulator's borrowing did; it is set from the workload's mean prompt instead: a cached
request keeps about RETAINED_PER_REQUEST = 1.2 checkpoints (its end, sometimes a branch point)
over mean_tokens / P chain blocks, plus mean_tokens / every_n periodic ones, so checkpoint
sets per chain unit = (1.2 + mean_tokens / every_n) x P / mean_tokens.  Periodic checkpoints
(every_n = 1024, rounded up to a multiple of P) pay only once the budget holds DENSE_REQUESTS =
2000 mean prompts; below that they evict the retention points other requests would hit.
Chosen from v4-mini sweeps on both Mooncake traces and the bench's synthetic generator (the
optimum sits at 0.03-0.05 sets per unit at 10k blocks on Mooncake, 0.13 on the generator's
shorter prompts, about 0.5 with periodic checkpoints at 100k; all at 512-token pages);
`--snapshot-fraction` / `--every-n` override it.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

from hybridkv.bench.managers import Served
from hybridkv.bench.traces import DEFAULT_VOCAB, request_token_ids
from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused
from hybridkv.layout import ceil_div
from hybridkv.layout import ModelLayout
from hybridkv.policy import FilteredLRUPolicy

PAGE_TOKENS = 512              # tokens per capacity block; the page on Mooncake traces
HCA_RATIO = 128                # v4-mini's m': its page is a multiple of this
CHUNK_TOKENS = 2048            # prefill chunk
LAYOUT_NAMES = ("full", "v4-mini")
RETAINED_PER_REQUEST = 1.2     # checkpoints a cached request keeps besides periodic ones
DENSE_REQUESTS = 2000          # periodic checkpoints once the budget holds this many prompts
DENSE_EVERY_N = 1024


def page_tokens(layout_name: str, block_tokens: int = PAGE_TOKENS) -> int:
    """Tokens per runtime page for a trace of `block_tokens`-token hash ids (module docstring)."""
    if layout_name == "v4-mini":
        return ceil_div(block_tokens, HCA_RATIO) * HCA_RATIO
    return block_tokens


def tuned(layout_name: str, capacity_blocks: int, mean_tokens: float,
          page: int = PAGE_TOKENS) -> dict:
    """Default ``every_n`` and checkpoint sets per chain unit of `page` tokens (see the module
    docstring, "Tuning"); a layout without snapshots needs neither."""
    if layout_name != "v4-mini":
        return {"every_n": 0, "checkpoints_per_chain": 0.0}
    mean_tokens = max(mean_tokens, page)
    dense = capacity_blocks * PAGE_TOKENS >= DENSE_REQUESTS * mean_tokens
    every_n = ceil_div(DENSE_EVERY_N, page) * page if dense else 0
    per_request = RETAINED_PER_REQUEST + (mean_tokens / every_n if every_n else 0.0)
    return {"every_n": every_n, "checkpoints_per_chain": per_request * page / mean_tokens}


class RuntimeLayoutError(ValueError):
    """Not a runtime layout name. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"unknown runtime layout {value!r}; choose one of {LAYOUT_NAMES}")
        self.value = value


def runtime_layout(name: str, page_tokens: int = PAGE_TOKENS, vocab: int = DEFAULT_VOCAB):
    """The `hk.ModelLayout` a bench layout name replays through."""
    if name == "full":
        return ModelLayout.full(block_size=page_tokens, vocab=vocab)
    if name == "v4-mini":
        return ModelLayout.v4_mini(block_size=page_tokens, window=128, hca_ratio=128,
                                      vocab=vocab)
    raise RuntimeLayoutError(name)


class PoolSizing(NamedTuple):
    sizes: dict               # (kind, group) -> num_blocks
    block_nbytes: dict        # (kind, group) -> bytes per block
    unit: int                 # chain bytes of one page (one block in each chain pool)
    ckpt_bytes: int           # bytes of one checkpoint's exact objects at a block boundary
    budget_bytes: int         # capacity_blocks x chain bytes per 512 tokens
    floor_bytes: int          # working objects of the longest request
    bytes: int                # what the sizes hold (> budget only when the floor is)
    chain_units: int          # chain blocks per chain pool beyond the floor
    checkpoints: int          # checkpoint sets beyond the floor


def working_floor(rlayout, max_tokens: int, chunk_tokens: int, every_n: int) -> dict:
    """Blocks per pool one running request may hold at once (prefill in chunks): its whole
    chain (pinned) plus an open block, one chunk's window pages plus the pages restored at H,
    the working tails, and the exact objects of one allocation's checkpoints plus the
    provisional end of the previous chunk."""
    points = (chunk_tokens // every_n + 1 if every_n else 0) + 4
    need = {pk: 0 for pk in rlayout.pool_keys()}
    for g in rlayout.groups:
        for kind in g.kinds:
            pk = (kind, g.name)
            if kind in ("comp", "idx"):
                need[pk] += ceil_div(max_tokens, g.block_size) + 1
            if kind == "swa":
                need[pk] += ceil_div(chunk_tokens, g.window) + 2
            if kind in ("tail", "idx"):
                need[pk] += 1
    for spec in rlayout.exact_at(max(g.block_size for g in rlayout.groups)):
        need[(spec.kind, spec.group)] += points
    return need


def runtime_pool_sizes(rlayout, capacity_blocks: int, max_tokens: int,
                       chunk_tokens: int = CHUNK_TOKENS, every_n: int = 0,
                       snapshot_fraction: float | None = None,
                       checkpoints_per_chain: float = 0.0) -> PoolSizing:
    """Per-pool sizes from the byte budget (see the module docstring): after the working
    floor, ``snapshot_fraction`` of the rest for checkpoint sets when given, else as many sets
    as ``checkpoints_per_chain`` x the chain units."""
    nb = {pk: rlayout.block_nbytes(*pk) for pk in rlayout.pool_keys()}
    chain = rlayout.chain_pools()
    unit = sum(nb[pk] for pk in chain)
    boundary = max(g.block_size for g in rlayout.groups)
    exact = [(s.kind, s.group) for s in rlayout.exact_at(boundary)]
    ckpt_bytes = sum(nb[pk] for pk in exact)
    budget = capacity_blocks * unit * PAGE_TOKENS // boundary    # chain bytes scale with tokens
    floor = working_floor(rlayout, max_tokens, chunk_tokens, every_n)
    floor_bytes = sum(floor[pk] * nb[pk] for pk in floor)
    rest = max(0, budget - floor_bytes)
    if not ckpt_bytes:
        n_ckpt = 0
    elif snapshot_fraction is not None:
        n_ckpt = int(snapshot_fraction * rest) // ckpt_bytes
    else:
        n_ckpt = int(checkpoints_per_chain * rest / (unit + checkpoints_per_chain * ckpt_bytes))
    n_chain = (rest - n_ckpt * ckpt_bytes) // unit
    sizes = dict(floor)
    for pk in chain:
        sizes[pk] += n_chain
    for pk in exact:
        sizes[pk] += n_ckpt
    sizes = {pk: max(1, n) for pk, n in sizes.items()}
    return PoolSizing(sizes, nb, unit, ckpt_bytes, budget, floor_bytes,
                      sum(sizes[pk] * nb[pk] for pk in sizes), n_chain, n_ckpt)


class RuntimeManager:
    """Contract: ``prepare(trace, req)`` -> the prompt's token ids (untimed), then
    ``serve(trace, req, tokens) -> Served`` with hit tokens = the HitPlan's reuse_tokens (0
    when an allocation was refused); ``ops`` counts the manager calls made."""

    def __init__(self, layout_name: str, capacity_blocks: int, max_tokens: int,
                 mean_tokens: float | None = None, every_n: int | None = None,
                 snapshot_fraction: float | None = None,
                 chunk_tokens: int = CHUNK_TOKENS, policy_factory: Callable | None = None,
                 vocab: int = DEFAULT_VOCAB, hints: bool = True, checked: bool = False,
                 block_tokens: int = PAGE_TOKENS):
        self.page_tokens = page_tokens(layout_name, block_tokens)
        defaults = tuned(layout_name, capacity_blocks,
                         max_tokens if mean_tokens is None else mean_tokens, self.page_tokens)
        every_n = defaults["every_n"] if every_n is None else every_n
        policy_factory = policy_factory or FilteredLRUPolicy
        self.policy_name = getattr(policy_factory, "__name__", repr(policy_factory))
        self.hints = hints
        self.rlayout = runtime_layout(layout_name, self.page_tokens, vocab)
        self.chunk_tokens = chunk_tokens
        self.snapshot_fraction = snapshot_fraction
        self.checkpoints_per_chain = defaults["checkpoints_per_chain"]
        self.sizing = runtime_pool_sizes(self.rlayout, capacity_blocks, max_tokens,
                                         chunk_tokens, every_n, snapshot_fraction,
                                         defaults["checkpoints_per_chain"])
        self.mgr = CacheManager(self.rlayout, num_blocks=self.sizing.sizes, device="meta",
                                every_n=every_n, policy_factory=policy_factory,
                                checked=checked)
        self.vocab = vocab
        self.ids = itertools.count()
        self.refused = 0
        self.ops = 0

    def prepare(self, trace, req) -> list:
        return request_token_ids(trace, req, self.vocab)

    def serve(self, trace, req, tokens: list) -> Served:
        rid = next(self.ids)
        m, n = self.mgr, len(tokens)
        plan = m.lookup(rid, tokens, salt=req.tenant.encode(),
                        hint=req.output_class if self.hints else "")
        hit, ops = plan.reuse_tokens, 2
        try:
            done = hit
            while done < n:
                a = m.allocate(rid, min(self.chunk_tokens, n - done))
                ops += 1
                pos = a.start
                for p in a.checkpoints:
                    if pos < p < a.end:
                        m.commit(rid, p - pos)
                        pos, ops = p, ops + 1
                m.commit(rid, a.end - pos)
                done, ops = a.end, ops + 1
        except AdmissionRefused:
            self.refused += 1
            hit = 0
        m.free(rid)
        self.ops += ops
        return Served(hit // trace.block_size, hit, plan.group_hits)

    def describe(self) -> dict:
        """What this replay ran: pools, sizing, options, refusals."""
        sz = self.sizing
        return {"layout": repr(self.rlayout), "device": str(self.mgr.device),
                "page_tokens": self.page_tokens,
                "every_n": self.mgr.snapshots.every_n, "chunk_tokens": self.chunk_tokens,
                "snapshot_fraction": self.snapshot_fraction,
                "checkpoints_per_chain": self.checkpoints_per_chain, "policy": self.policy_name,
                "hints": self.hints, "refused": self.refused,
                "budget_bytes": sz.budget_bytes, "bytes": sz.bytes,
                "floor_bytes": sz.floor_bytes, "unit_bytes": sz.unit,
                "checkpoint_bytes": sz.ckpt_bytes, "chain_units": sz.chain_units,
                "checkpoint_sets": sz.checkpoints,
                "num_blocks": {f"{k}/{g}": n for (k, g), n in sz.sizes.items()}}
