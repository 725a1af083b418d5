"""The memory of a replay (bench.runtime): one byte budget, laid out either as one block arena
or as fixed per-pool sizes (``--memory arena|fixed``; RuntimeManager picks the default).

Budget (`byte_budget`): `capacity_blocks` x the layout's chain bytes per 512 tokens (comp +
idx of every chained group), whatever the page.  Both layouts of the budget first hold the
working objects of the longest request (`working_floor`: its pinned chain, one chunk's window
pages, tails and the snapshots of one allocation); when those exceed the budget the memory is
the floor.

Arena (`arena_sizing`): ``CacheManager(num_pages=N)``, N = budget // page bytes.  Every
pool's blocks are pages of the arena, so the share of snapshots and chain blocks follows demand:
when pages are short the arena picks the pool that gives one back and that pool evicts through
its own policy (hybridkv.cache.arena).  A page is as large as the layout's largest block and
every smaller block is padded up to it, so `arena_layout` grows each chained group's blocks
(doubling its tokens) until its comp block is at least the largest block whose size does not
follow the block (tails, windows): on v4-mini at 512-token pages the 32,512-byte HCA tail sets
the page, CSA blocks grow to 1024 tokens (a 32 KiB comp block) and HCA blocks to 32,768 (the
held pages pad 71% with 512-token blocks everywhere, 25-39% so).  Hits keep the 512-token
granule: a resume point off a grown block's boundary reads that group's open comp block from
the checkpoint, as every v4-mini hit reads its window from one.

Fixed split (`runtime_pool_sizes`, `tuned`): per-pool sizes from the budget.  After the floor
the rest is split between chain units (``unit``: one block in each chain pool) and checkpoint
sets (the exact objects of a checkpoint at a block boundary: one block in each snapshot pool,
``ckpt_bytes`` = 2.03 units on v4-mini at 512-token pages, where the HCA tails are empty and so
no object).  The split cannot follow demand as the simulator's borrowing does; it is set from
the workload's mean prompt: a cached request keeps about RETAINED_PER_REQUEST = 1.2 checkpoints
(its end, sometimes a branch point) over mean_tokens / P chain blocks, plus PERIODIC_KEPT =
0.5 of its mean_tokens / every_n periodic ones (all of them where every_n is a granule finer
than the page), so checkpoint sets per chain unit = (1.2 + 0.5 x mean_tokens / every_n) x P /
mean_tokens.  Chosen from v4-mini sweeps on both Mooncake traces and the bench's synthetic
generator (the optimum sits at 0.03-0.05 sets per unit at 10k blocks on Mooncake, 0.13 on the
generator's shorter prompts, about 0.3 with periodic checkpoints at 100k; all at 512-token
pages); `--snapshot-fraction` overrides it.

Periodic checkpoints (both layouts; `tuned`): every_n = 1024 tokens (rounded up to a multiple
of P) once the budget holds DENSE_REQUESTS = 2000 mean prompts; below that they evict the
retention points other requests would hit.  On a trace of blocks finer than P (v4-mini's hash
granule is then the trace's block) a dense budget checkpoints every granule, as LRU's engine
rule counts a block's state with it: a family's prompts resume where they part, however short
the shared prefix (synthetic stream, 16-token blocks, 100k blocks: 0.741903 = LRU, against
0.7400 with a checkpoint every 1024 tokens, in 5x the replay time).  `--every-n` overrides it.
Forks (``CacheManager(forks=True)``: a checkpoint where a prompt parts from an earlier one that
went on past the shared prefix, at least a page in) are on at every budget: Mooncake synthetic 1k
0.0701 -> 0.0732, 10k 0.3868 -> 0.4098, conversation 10k 0.1929 -> 0.1937.  Counting every
shared prefix as a fork (a conversation's next turn extends its last, whose own checkpoints
are where it resumes) and forks shorter than a page cost hits at small budgets instead
(synthetic stream, 16-token blocks, 1k: 0.540 -> 0.480 and 0.519).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

from hybridkv.bench.layouts import BLOCK
from hybridkv.errors import LayoutWarning
from hybridkv.layout import ModelLayout, ceil_div

RETAINED_PER_REQUEST = 1.2     # checkpoints a cached request keeps besides periodic ones
PERIODIC_KEPT = 0.5            # share of its periodic checkpoints it keeps (every 1024 tokens)
DENSE_REQUESTS = 2000          # periodic checkpoints once the budget holds this many prompts
DENSE_EVERY_N = 1024
CHUNK_TOKENS = 2048            # prefill chunk (bench.runtime)


def tuned(layout_name: str, capacity_blocks: int, mean_tokens: float, page: int = BLOCK,
          granule: int | None = None) -> dict:
    """Default ``every_n``, forks and checkpoint sets per chain unit of `page` tokens (see the
    module docstring); a layout without snapshots needs none of them.  ``granule``: the
    runtime layout's hash granule where it is finer than the page (a trace of small blocks)."""
    if layout_name != "v4-mini":
        return {"every_n": 0, "forks": False, "checkpoints_per_chain": 0.0}
    mean_tokens = max(mean_tokens, page)
    dense = capacity_blocks * BLOCK >= DENSE_REQUESTS * mean_tokens
    every_n = ceil_div(DENSE_EVERY_N, page) * page if dense else 0
    kept = PERIODIC_KEPT
    if dense and granule is not None and granule < page:
        every_n, kept = granule, 1.0          # every granule's state, as LRU keeps each block's
    per_request = RETAINED_PER_REQUEST + (kept * mean_tokens / every_n if every_n else 0.0)
    return {"every_n": every_n, "forks": True,
            "checkpoints_per_chain": per_request * page / mean_tokens}


def byte_budget(rlayout: ModelLayout, capacity_blocks: int) -> int:
    """`capacity_blocks` x the chain bytes of BLOCK tokens of `rlayout` (one block size for
    every group: bench.runtime.runtime_layout)."""
    unit = sum(rlayout.block_nbytes(*pk) for pk in rlayout.chain_pools())
    return capacity_blocks * unit * BLOCK // max(g.block_size for g in rlayout.groups)


def working_floor(rlayout: ModelLayout, max_tokens: int, chunk_tokens: int,
                  every_n: int) -> dict:
    """Blocks per pool one running request may hold at once (prefill in chunks): its whole
    chain (pinned) plus an open block, one chunk's window pages plus the pages restored at H,
    the working tails, and the exact objects of one allocation's checkpoints (at the granule:
    every kind, the open comp blocks of grown groups too) plus the provisional end of the
    previous chunk."""
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
    for spec in rlayout.exact_at(rlayout.granule):
        need[(spec.kind, spec.group)] += points
    return need


def arena_layout(rlayout: ModelLayout) -> ModelLayout:
    """`rlayout` with each chained group's blocks doubled until its comp block is at least the
    largest block that does not grow with the block (tails, windows): the arena's page, which
    every kind then pads to least (module docstring).  A layout of chain pools alone is
    returned as it is."""
    fixed = [rlayout.block_nbytes(*pk) for pk in rlayout.pool_keys()
             if pk not in rlayout.chain_pools()]
    if not fixed:
        return rlayout
    groups = []
    for g in rlayout.groups:
        while "comp" in g.kinds and rlayout.block_nbytes("comp", g) < max(fixed):
            g = g._replace(block_size=2 * g.block_size)
        groups.append(g)
    with warnings.catch_warnings():           # a large LCM: hits read exact checkpoints
        warnings.simplefilter("ignore", LayoutWarning)
        return ModelLayout(groups, name=rlayout.name, kernel_version=rlayout.kernel_version,
                           model_version=rlayout.model_version, vocab=rlayout.vocab)


class ArenaSizing(NamedTuple):
    num_pages: int            # budget // page bytes, at least the floor
    page_nbytes: int          # the largest block of the layout
    budget_bytes: int
    floor_pages: int          # working objects of the longest request, a page each

    def describe(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "bytes": self.num_pages * self.page_nbytes,
                "num_pages": self.num_pages, "page_bytes": self.page_nbytes,
                "floor_pages": self.floor_pages}


def arena_sizing(rlayout: ModelLayout, budget_bytes: int, max_tokens: int, chunk_tokens: int,
                 every_n: int) -> ArenaSizing:
    """Pages of the arena over `rlayout` (arena_layout's) for `budget_bytes`."""
    page = rlayout.page_nbytes()
    floor = sum(working_floor(rlayout, max_tokens, chunk_tokens, every_n).values())
    return ArenaSizing(max(budget_bytes // page, floor), page, budget_bytes, floor)


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

    def describe(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "bytes": self.bytes,
                "floor_bytes": self.floor_bytes, "unit_bytes": self.unit,
                "checkpoint_bytes": self.ckpt_bytes, "chain_units": self.chain_units,
                "checkpoint_sets": self.checkpoints,
                "num_blocks": {f"{k}/{g}": n for (k, g), n in self.sizes.items()}}


def runtime_pool_sizes(rlayout: ModelLayout, capacity_blocks: int, max_tokens: int,
                       chunk_tokens: int = CHUNK_TOKENS, every_n: int = 0,
                       snapshot_fraction: float | None = None,
                       checkpoints_per_chain: float = 0.0) -> PoolSizing:
    """Per-pool sizes from the byte budget (see the module docstring): after the working
    floor, ``snapshot_fraction`` of the rest for checkpoint sets when given, else as many sets
    as ``checkpoints_per_chain`` x the chain units."""
    nb = {pk: rlayout.block_nbytes(*pk) for pk in rlayout.pool_keys()}
    chain = rlayout.chain_pools()
    unit = sum(nb[pk] for pk in chain)
    exact = [(s.kind, s.group) for s in rlayout.exact_at(rlayout.granule)]
    ckpt_bytes = sum(nb[pk] for pk in exact)
    budget = byte_budget(rlayout, capacity_blocks)
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
