"""The captured part of a decode step: the SWA window gather of layer 0 through the static
block table into a static output buffer.

With CUDA (pools on a CUDA device) it is captured once as a real ``torch.cuda.CUDAGraph`` and
replayed with ``CUDAGraph.replay`` -- the graph bakes in the addresses of the block table, the
pool and the output, which is why DecodeGraph replays it only behind the spec's topology guard
(kernels.guards.GuardedGraph -> spec.funnel.can_replay) and re-captures after a relocation.
After each CUDA replay the gathered rows are compared with an eager gather (``mismatches``).
On CPU the same callable runs eagerly behind the same guard.

NOT TESTED ON A GPU in this repository's CI (no GPU on the build machine); see
scripts/gpu_check.py for the kernels' own CUDA-graph check.  V4Mini.forward itself has
data-dependent shapes and host syncs, so the rest of the decode step stays eager.
"""
import torch


def gather(pool, block_table, out):
    """out[b] = pool[block_table[b]] (an unheld entry, -1, reads block 0: never used)."""
    torch.index_select(pool, 0, block_table.clamp(min=0), out=out)


class CapturedGather:
    def __init__(self, pool, block_table, out):
        self.pool, self.bt, self.out = pool, block_table, out
        self.cuda = pool.is_cuda
        self.mismatches = 0
        self.graph = None
        if self.cuda:
            self._capture_cuda()

    def _capture_cuda(self):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                 # warm-up outside the capture
            gather(self.pool, self.bt, self.out)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            gather(self.pool, self.bt, self.out)

    def replay(self):
        if not self.cuda:
            gather(self.pool, self.bt, self.out)
            return
        self.graph.replay()
        eager = torch.empty_like(self.out)
        gather(self.pool, self.bt, eager)
        self.mismatches += not torch.equal(eager, self.out)
