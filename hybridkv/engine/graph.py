"""Decode graph guard: the captured part of a decode step runs through static buffers over the
CacheManager's pool tensors (one memory: the graph reads the same tensor the kernels do).

The static buffers (the block table of the first layer's window pages and the gathered window)
and the manager's pool tensor are the addresses a captured decode graph bakes in.  Before every
replay the current addresses go through ``kernels.guards.GuardedGraph`` (spec.funnel.can_replay);
a relocation (a static buffer re-allocated because a table outgrew it, or ``relocate()``) makes
the replay refused, and the guard re-captures first.  The buffers' *contents* are refreshed in
place from the request's tables before every replay (a graph must never read a fixed buffer
whose contents were not refreshed).

What is replayed is hybridkv.engine.cudagraph.CapturedGather (layer 0's window gather through
the static block table): a real ``torch.cuda.CUDAGraph`` when the pools are on CUDA, the same
callable run eagerly on CPU -- the guard path is identical.  The rest of the decode step
(V4Mini.forward: data-dependent shapes) runs eagerly.
"""
import torch

from hybridkv.engine.cudagraph import CapturedGather
from kernels.guards import GuardedGraph, LaunchRefused


class DecodeGraph:
    def __init__(self, cache, max_blocks=16, skip_guard=False):
        self.cache, self.skip_guard = cache, skip_guard
        layer = min(cache.layout.layer_slot)
        self.group = cache.layout.layer_slot[layer][0]
        self.pool = cache.layer_pools(layer)["swa"]["kv"]
        self.max_blocks = max_blocks
        self.bufs = self._alloc(max_blocks)
        self.graph, self.kernel = None, None
        self.captures = self.replays = self.refused = 0
        self.cuda = self.pool.is_cuda

    def _alloc(self, n):
        dev = self.pool.device
        return {"block_table": torch.zeros((n,), dtype=torch.long, device=dev),
                "window": torch.zeros((n, *self.pool.shape[1:]), device=dev)}

    def _current(self):
        return dict(self.bufs, pool=self.pool)

    def _capture(self):
        self.kernel = CapturedGather(self.pool, self.bufs["block_table"], self.bufs["window"])
        self.graph = GuardedGraph(self.kernel.replay, self._current())
        self.captures += 1

    @property
    def mismatches(self):
        """CUDA replays whose output differed from the eager gather (0 on CPU)."""
        return self.kernel.mismatches if self.kernel is not None else 0

    def relocate(self):
        """Re-allocate the static buffers: every captured buffer address moves."""
        self.bufs = self._alloc(self.max_blocks)

    def _refresh(self, work):
        table = [b for b in work.tables[self.group].swa if b >= 0]
        if len(table) > self.max_blocks:              # outgrew the static buffer: relocation
            self.max_blocks = 2 * len(table)
            self.bufs = self._alloc(self.max_blocks)
        bt = self.bufs["block_table"]
        bt.zero_()
        bt[:len(table)] = torch.as_tensor(table, dtype=torch.long)
        return table

    def step(self, work):
        """Replay the captured gather for one decode request's ``work`` (a SeqWork) behind
        the topology guard; returns the gathered window pages (checked by tests)."""
        table = self._refresh(work)
        if self.graph is None:
            self._capture()
        if self.skip_guard:
            self.kernel.replay()                  # seeded bug: replay without the guard
        else:
            try:
                self.graph.replay(self._current())
            except LaunchRefused:
                self.refused += 1
                self._capture()
                self.graph.replay(self._current())
        self.replays += 1
        return self.bufs["window"][:len(table)]
