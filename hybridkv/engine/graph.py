"""Decode graph guard: decode steps run through static buffers captured once.

The static buffers (block table, slot mapping, position) and the model's pool tensors are the
addresses a captured decode graph bakes in.  Before every replay the current addresses go
through ``kernels.guards.GuardedGraph`` (spec.funnel.can_replay); a relocation (a buffer or pool
re-allocated, e.g. pool growth) makes the replay refused, and the guard re-captures first.  The
buffers' *contents* are refreshed in place before every replay (a graph must never read a
fixed buffer whose contents were not refreshed).

What is replayed is hybridkv.engine.cudagraph.CapturedGather (layer 0's window gather through
the static block table): a real ``torch.cuda.CUDAGraph`` when the model's pools are on CUDA
(untested here: no GPU), the same callable run eagerly on CPU -- the guard path is identical.
The rest of the decode step (V4Mini.forward: data-dependent shapes, host syncs) runs eagerly on
the refreshed buffers.
"""
import torch

from hybridkv.engine.cudagraph import CapturedGather
from kernels.guards import GuardedGraph, LaunchRefused


class DecodeGraph:
    def __init__(self, model_cache, max_blocks=16, skip_guard=False):
        self.mc, self.skip_guard = model_cache, skip_guard
        self.max_blocks = max_blocks
        self.bufs = self._alloc(max_blocks)
        self.graph, self.captures, self.replays, self.refused = None, 0, 0, 0
        self.kernel = None
        self.cuda = self.mc.pools[("swa", 0)].is_cuda

    def _alloc(self, n):
        dev, cfg = self.mc.device, self.mc.cfg
        return {"block_table": torch.full((n,), -1, dtype=torch.long, device=dev),
                "slot": torch.zeros((1,), dtype=torch.long, device=dev),
                "position": torch.zeros((1,), dtype=torch.long, device=dev),
                "window": torch.zeros((n, cfg.swa_block, cfg.head_dim), device=dev)}

    def _current(self):
        cur = dict(self.bufs)
        cur.update({f"pool/{k}/{l}": t for (k, l), t in self.mc.pools.items()})
        return cur

    def _capture(self):
        self.kernel = CapturedGather(self.mc.pools[("swa", 0)], self.bufs["block_table"],
                                     self.bufs["window"])
        self.graph = GuardedGraph(self.kernel.replay, self._current())
        self.captures += 1

    @property
    def mismatches(self):
        """CUDA replays whose output differed from the eager gather (0 on CPU)."""
        return self.kernel.mismatches if self.kernel is not None else 0

    def relocate(self, extra_blocks=8):
        """Grow every model pool by ``extra_blocks`` (new tensors: every address moves)."""
        for key, t in list(self.mc.pools.items()):
            grown = torch.full((t.shape[0] + extra_blocks, *t.shape[1:]), float("nan"),
                               device=t.device)
            grown[:t.shape[0]] = t
            self.mc.pools[key] = grown
            self.mc.free_blocks[key] = list(range(t.shape[0] + extra_blocks - 1,
                                                  t.shape[0] - 1, -1)) + self.mc.free_blocks[key]
        self.mc.num_blocks += extra_blocks

    def _refresh(self, state):
        table = state.layers[0].swa
        if len(table) > self.max_blocks:              # outgrew the static buffer: relocation
            self.max_blocks = 2 * len(table)
            self.bufs = self._alloc(self.max_blocks)
        bt = self.bufs["block_table"]
        bt.fill_(-1)
        bt[:len(table)] = torch.as_tensor(table, dtype=torch.long)
        pos = state.length
        bs = self.mc.cfg.swa_block
        self.bufs["position"].fill_(pos)
        self.bufs["slot"].fill_(table[pos // bs] * bs + pos % bs)      # reserved above

    def step(self, model, token, state):
        """One guarded decode step of ``token`` on ``state``; returns the logits [1, vocab]."""
        state.reserve(1)
        self._refresh(state)
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
        assert int(self.bufs["position"]) == state.length
        return model.forward([int(token)], state)
