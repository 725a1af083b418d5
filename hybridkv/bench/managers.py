"""Block-level cache managers over trace keys: the LRU baseline, and the simulator of issue 8.

A manager has ``prepare(trace, req)`` (untimed; nothing here) and ``serve(trace, req, prepared)
-> Served``: one lookup + allocate + free of the request, returning what was reused (the replay
loop: bench.replay).  ``hybridkv replay`` runs ours through the real CacheManager
(bench.runtime); the simulator stays as a reference for tests and the oracle experiments.

`LRUManager`     vLLM-style single queue over the trace's blocks. Capacity is in 512-token
                 blocks of the layout's bytes; a trace block of N tokens costs N/512 of a block,
                 and on v4-mini every block also keeps its own window and tails (a checkpoint
                 at each block end), so one unit costs block + checkpoint bytes.
                 ``engine_rule=True`` counts hits as an engine can use them (vLLM's
                 get_computed_blocks): whole blocks only, and never the whole prompt (its last
                 token is always computed), so at most (input_length - 1) // block blocks; the
                 default counts every leading cached trace block, partial last one included.
`PolicyManager`  the simulator ("ours" before the runtime replay). Policies (one fixed
                 configuration for every trace, layout, capacity):
                 blocks: policy.FilteredLRUPolicy (recency, rarely-reused classes first;
                 blocks of one layout all cost the same bytes), checkpoints: policy.ValuePolicy
                 (greedy-dual on learned reuse x FLOPs saved per byte: a checkpoint at depth H
                 saves prefix_flops(H) for about the same bytes).
                 A prefix tree of blocks in a block pool and, for hybrid layouts,
                 checkpoints (window + tails at H) in their own pool (per-kind pools:
                 evicting for one kind never takes the other's bytes; evicting a block
                 invalidates the checkpoint at its end). Hit at H = deepest checkpoint on
                 the leading run of cached blocks (any block end for `full`). Only leaves (no
                 cached children) that the running request does not use are offered to the policy.
                 The checkpoint pool keeps a reserve (`ckpt_fraction`) and grows into bytes the
                 block pool leaves free (`borrow`); when blocks need them back, the checkpoint
                 pool shrinks by evicting its own victims (a resize, never a cross-kind evict).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from hybridkv.bench.baselines import LRUPrefixCache
from hybridkv.bench.layouts import BLOCK, LayoutCost
from hybridkv.policy import EntryMeta, FilteredLRUPolicy, ValuePolicy, count_unkept


class Served(NamedTuple):
    hit_blocks: int
    hit_tokens: int
    groups: dict              # group name -> hit tokens that group alone could give


class LRUManager:
    def __init__(self, layout: LayoutCost, capacity_blocks: int, block_tokens: int = BLOCK,
                 engine_rule: bool = False):
        unit = layout.block_bytes * block_tokens / BLOCK + layout.checkpoint_bytes(block_tokens)
        self.layout = layout
        self.engine_rule = engine_rule
        self.cache = LRUPrefixCache(int(capacity_blocks * layout.block_bytes // unit))

    def prepare(self, trace, req) -> None:
        return None

    def serve(self, trace, req, prepared=None) -> Served:
        k = self.cache.serve(trace.keys(req))
        if self.engine_rule:
            k = min(k, trace.reusable_blocks(req))
        tok = sum(trace.block_tokens(req, i) for i in range(k))
        return Served(k, tok, {"all": tok})


def _tag(req, partial: bool) -> str:
    # request features known when its blocks are freed; the policy learns reuse per tag
    return f"{'tail' if partial else 'mid'}/{req.output_class}"


class _Node:
    __slots__ = ("parent", "children", "ckpt")

    def __init__(self, parent):
        self.parent = parent
        self.children = 0
        self.ckpt = False


class PolicyManager:
    def __init__(self, layout: LayoutCost, capacity_blocks: int,
                 policy_factory: Callable = FilteredLRUPolicy, ckpt_fraction: float = 0.12,
                 every_n: int = 2, borrow: bool = True,
                 periodic_free: float = 0.0, ckpt_policy_factory: Callable | None = ValuePolicy,
                 engine_rule: bool = False, partial_blocks: bool = True):
        budget = capacity_blocks * layout.block_bytes
        self.layout = layout
        self.engine_rule = engine_rule        # hits as LRUManager(engine_rule=True) counts them
        self.partial_blocks = partial_blocks  # False: a request's partial last block is never
        # cached, only counted as written (the block policy's ``unkept``), as the runtime does
        self.hybrid = layout.needs_checkpoint
        frac = ckpt_fraction if self.hybrid else 0.0
        self.budget = budget
        self.ckpt_reserved = int(budget * frac)
        self.block_budget = budget - self.ckpt_reserved
        self.borrow = borrow
        self.periodic_free = periodic_free    # periodic checkpoints only while this much is free
        self.block_used = self.ckpt_used = 0
        self.blocks = policy_factory()
        self.ckpts = (ckpt_policy_factory or policy_factory)()
        self.nodes: dict = {}
        self._ckpt_h: dict = {}               # key -> (H, bytes) of its checkpoint
        self.pinned: set = set()
        self.now = 0
        self.every_n = every_n                # also checkpoint every N blocks, into free room only

    # -- eviction -------------------------------------------------------------------------
    def _drop_block(self, key, evicted: bool) -> None:
        node = self.nodes.pop(key)
        self.blocks.remove(key, evicted)
        self.block_used -= self.layout.block_bytes
        if node.ckpt:
            self._drop_ckpt(key, False)
        p = node.parent
        if p is not None and p in self.nodes:
            pn = self.nodes[p]
            pn.children -= 1
            if pn.children == 0 and p not in self.pinned:
                self.blocks.eligible(p)

    def _drop_ckpt(self, key, evicted: bool) -> None:
        self.ckpts.remove(key, evicted)
        self.ckpt_used -= self._ckpt_h.pop(key)[1]
        node = self.nodes.get(key)
        if node is None:
            return
        node.ckpt = False
        # blocks past the last checkpoint of a branch can no longer be resumed from: prune
        while (evicted and node is not None and node.children == 0 and not node.ckpt
               and key not in self.pinned):
            parent = node.parent
            self._drop_block(key, False)
            key, node = parent, self.nodes.get(parent)

    @property
    def ckpt_budget(self) -> int:
        """The checkpoint pool: its reserve, grown into whatever the block pool leaves free."""
        if not self.borrow:
            return self.ckpt_reserved
        return self.budget - self.block_used

    def _room(self, pool: str, nbytes: int) -> bool:
        if pool == "block":
            while self.block_used + nbytes > self.block_budget:
                v = self.blocks.victim()
                if v is None:
                    return False
                self._drop_block(v, True)
            # the checkpoint pool shrinks back (evicting its own victims) to at least its reserve
            while self.block_used + self.ckpt_used + nbytes > self.budget:
                v = self.ckpts.victim()
                if v is None:
                    return False
                self._drop_ckpt(v, True)
        else:
            while self.ckpt_used + nbytes > self.ckpt_budget:
                v = self.ckpts.victim()
                if v is None:
                    return False
                self._drop_ckpt(v, True)
        return True

    # -- serve ----------------------------------------------------------------------------
    def prepare(self, trace, req) -> None:
        return None

    def serve(self, trace, req, prepared=None) -> Served:
        self.now += 1
        keys = trace.keys(req)
        bs = trace.block_size
        nodes, lay = self.nodes, self.layout
        n = len(keys)
        chain = 0
        hit = 0
        limit = trace.reusable_blocks(req) if self.engine_rule else n
        for i, k in enumerate(keys):
            node = nodes.get(k)
            if node is None:
                break
            chain = i + 1
            if (not self.hybrid or node.ckpt) and i < limit:
                hit = i + 1
        chain_tok = sum(trace.block_tokens(req, i) for i in range(chain))
        hit_tok = sum(trace.block_tokens(req, i) for i in range(hit))
        pinned = self.pinned
        for k in keys:                              # lookup taken: pin and touch what exists
            if k in nodes:
                pinned.add(k)
                self.blocks.access(k, self.now)
                self.blocks.ineligible(k)
        if hit and self.hybrid:                     # the checkpoint resumed from is pinned too
            self.ckpts.access(keys[hit - 1], self.now)
            self.ckpts.ineligible(keys[hit - 1])
        parent = None
        for i, k in enumerate(keys):                # allocate what is missing, in chain order
            if k not in nodes:
                if not self.partial_blocks and trace.block_tokens(req, i) < bs:
                    count_unkept(self.blocks)
                    break
                if not self._room("block", lay.block_bytes):
                    break
                if parent is not None and parent not in nodes:
                    break
                nodes[k] = _Node(parent)
                if parent is not None:
                    nodes[parent].children += 1
                start, t = i * bs, trace.block_tokens(req, i)
                self.blocks.admit(EntryMeta(k, "block", lay.block_bytes,
                                            lay.span_flops(start, start + t),
                                            _tag(req, t < bs)), self.now)
                self.block_used += lay.block_bytes
                pinned.add(k)
            parent = k
        if self.hybrid:
            full = req.input_length // bs
            for i in self.ckpts.checkpoints(n, chain, full):
                self._add_ckpt(keys[i], (i + 1) * bs, "branch" if i < full - 1 else "end")
            if self.every_n and self.budget - self.block_used - self.ckpt_used >= \
                    self.periodic_free * self.budget:
                for i in range(self.every_n - 1, full - 1, self.every_n):
                    self._add_ckpt(keys[i], (i + 1) * bs, "periodic", evict=False)
        if hit and self.hybrid and keys[hit - 1] in self._ckpt_h:
            self.ckpts.eligible(keys[hit - 1])
        for k in keys:                              # free: unpin
            if k in pinned:
                pinned.discard(k)
                node = nodes.get(k)
                if node is not None and node.children == 0:
                    self.blocks.eligible(k)
        groups = {"compressed": chain_tok, "window+tail": hit_tok} if self.hybrid else \
            {"all": hit_tok}
        return Served(hit, hit_tok, groups)

    def _add_ckpt(self, key, h: int, tag: str, evict: bool = True) -> None:
        node = self.nodes.get(key)
        if node is None or node.ckpt:
            return
        nbytes = self.layout.checkpoint_bytes(h)
        if not evict and self.ckpt_used + nbytes > self.ckpt_budget:
            return
        if not self._room("ckpt", nbytes) or key not in self.nodes:
            return
        self._ckpt_h[key] = (h, nbytes)
        node.ckpt = True
        self.ckpt_used += nbytes
        self.ckpts.admit(EntryMeta(key, "checkpoint", nbytes, self.layout.prefix_flops(h), tag),
                         self.now)
        self.ckpts.eligible(key)
