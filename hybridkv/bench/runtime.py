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
hold whole compressed entries); where the trace's block divides that page its window group
keeps the trace's block, so the hash granule (the GCD of the blocks) is the trace's block: a
hit resumes at any whole trace block where a checkpoint holds the open compressed blocks.

Memory (bench.sizing): one byte budget, `capacity_blocks` x the layout's chain bytes per 512
tokens, drawn as one block arena of equal pages (``arena=True``, ``--memory arena``:
``CacheManager(num_pages=N)``, snapshots and chain blocks share every page, the arena picks
which kind gives one back; the chained groups' blocks grown so the pages pad least,
`arena_layout`) or as fixed per-pool sizes split from the mean prompt (``arena=False``,
``--memory fixed``: `runtime_pool_sizes`).  The default is the arena where its pages pad
nothing (full: one pool, the same memory either way) and fixed pools where they pad (v4-mini:
25-39% of the held pages are padding, and the arena hits less at every point of
scripts/replay_table).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

from hybridkv.bench.layouts import BLOCK
from hybridkv.bench.managers import Served
from hybridkv.bench.sizing import (CHUNK_TOKENS, arena_layout, arena_sizing, byte_budget,
                                   runtime_pool_sizes, tuned)
from hybridkv.bench.traces import DEFAULT_VOCAB, request_token_ids
from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused
from hybridkv.layout import ModelLayout, ceil_div
from hybridkv.policy import FilteredLRUPolicy

PAGE_TOKENS = BLOCK            # tokens per capacity block; the page on Mooncake traces
HCA_RATIO = 128                # v4-mini's m': its page is a multiple of this
LAYOUT_NAMES = ("full", "v4-mini")


def page_tokens(layout_name: str, block_tokens: int = PAGE_TOKENS) -> int:
    """Tokens per runtime page for a trace of `block_tokens`-token hash ids (module docstring)."""
    if layout_name == "v4-mini":
        return ceil_div(block_tokens, HCA_RATIO) * HCA_RATIO
    return block_tokens


class RuntimeLayoutError(ValueError):
    """Not a runtime layout name. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"unknown runtime layout {value!r}; choose one of {LAYOUT_NAMES}")
        self.value = value


def runtime_layout(name: str, page_tokens: int = PAGE_TOKENS, vocab: int = DEFAULT_VOCAB,
                   block_tokens: int | None = None):
    """The `hk.ModelLayout` a bench layout name replays through.  ``block_tokens``: the
    trace's block, v4-mini's window group's (its hash granule) where it divides the page."""
    if name == "full":
        return ModelLayout.full(block_size=page_tokens, vocab=vocab)
    if name == "v4-mini":
        layout = ModelLayout.v4_mini(block_size=page_tokens, window=128, hca_ratio=128,
                                     vocab=vocab)
        if block_tokens is None or page_tokens % block_tokens or block_tokens == page_tokens:
            return layout
        return ModelLayout([g._replace(block_size=block_tokens) if g.kind == "swa" else g
                            for g in layout.groups], name=layout.name, vocab=vocab)
    raise RuntimeLayoutError(name)


class RuntimeManager:
    """Contract: ``prepare(trace, req)`` -> the prompt's token ids (untimed), then
    ``serve(trace, req, tokens) -> Served`` with hit tokens = the HitPlan's reuse_tokens (0
    when an allocation was refused); ``ops`` counts the manager calls made.  ``arena``: True
    one block arena, False fixed pools, None the arena where its pages pad nothing (module
    docstring, "Memory")."""

    def __init__(self, layout_name: str, capacity_blocks: int, max_tokens: int,
                 mean_tokens: float | None = None, every_n: int | None = None,
                 snapshot_fraction: float | None = None,
                 chunk_tokens: int = CHUNK_TOKENS, policy_factory: Callable | None = None,
                 vocab: int = DEFAULT_VOCAB, hints: bool = True, checked: bool = False,
                 block_tokens: int = PAGE_TOKENS, arena: bool | None = None,
                 forks: bool | None = None):
        self.page_tokens = page_tokens(layout_name, block_tokens)
        self.rlayout = runtime_layout(layout_name, self.page_tokens, vocab, block_tokens)
        defaults = tuned(layout_name, capacity_blocks,
                         max_tokens if mean_tokens is None else mean_tokens, self.page_tokens,
                         self.rlayout.granule)
        every_n = defaults["every_n"] if every_n is None else every_n
        forks = defaults["forks"] if forks is None else forks
        policy_factory = policy_factory or FilteredLRUPolicy
        self.policy_name = getattr(policy_factory, "__name__", repr(policy_factory))
        self.hints = hints
        paged = arena_layout(self.rlayout)
        if arena is None:                     # the arena where its pages pad nothing
            arena = not any(paged.page_padding().values())
        self.chunk_tokens = chunk_tokens
        if arena and snapshot_fraction is not None:
            raise ValueError("snapshot_fraction sizes the fixed split: it needs arena=False "
                             "(--memory fixed)")
        self.uses_arena = arena
        self.snapshot_fraction = None if arena else snapshot_fraction
        self.checkpoints_per_chain = None if arena else defaults["checkpoints_per_chain"]
        if arena:
            budget = byte_budget(self.rlayout, capacity_blocks)
            self.rlayout = paged
            self.sizing = arena_sizing(self.rlayout, budget, max_tokens, chunk_tokens, every_n)
            memory = {"num_pages": self.sizing.num_pages}
        else:
            self.sizing = runtime_pool_sizes(self.rlayout, capacity_blocks, max_tokens,
                                             chunk_tokens, every_n, snapshot_fraction,
                                             defaults["checkpoints_per_chain"])
            memory = {"num_blocks": self.sizing.sizes}
        self.mgr = CacheManager(self.rlayout, **memory, device="meta", every_n=every_n,
                                policy_factory=policy_factory, checked=checked,
                                forks=self.page_tokens if forks else False)
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
        """What this replay ran: the memory (arena pages or pool sizes, and in the arena the
        pages each kind holds now and the padding waste), options, refusals."""
        out = {"layout": repr(self.rlayout), "device": str(self.mgr.device),
               "page_tokens": self.page_tokens,
               "block_tokens": {g.name: g.block_size for g in self.rlayout.groups},
               "every_n": self.mgr.snapshots.every_n, "forks": self.mgr.seen is not None,
               "chunk_tokens": self.chunk_tokens,
               "arena": self.mgr.stats()["arena"] if self.uses_arena else None,
               "snapshot_fraction": self.snapshot_fraction,
               "checkpoints_per_chain": self.checkpoints_per_chain, "policy": self.policy_name,
               "hints": self.hints, "refused": self.refused}
        return {**out, **self.sizing.describe()}
