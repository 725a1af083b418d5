"""Plan step: build the block tables and index buffers a chunk's launches read.

Planning is host work done once per chunk and layer; the run step (the launch wrappers) only
checks and launches.  Every int32 buffer is padded to a multiple of 4 entries (16 bytes) so
that it passes the byte-alignment check of the launch.

A ``Launch`` is what the run step hands to Triton: the kernel, its grid, its arguments and its
constexprs.  Each kernel module has one function that builds it (``attention_launch``,
``compress_launch``, ``index_launch``); the wrappers run it and ``kernels.aot`` compiles it ahead
of time for a named GPU, so the compiled program is the one a launch would run.
"""
from typing import Any, Callable, NamedTuple, Sequence

import torch


class SeqSlice(NamedTuple):
    """One request's part of a chunk: queries at positions [start, start + n_new).
    Tables map logical block -> physical block in the matching pool (-1: not held)."""
    start: int
    n_new: int
    swa_table: Sequence[int]
    comp_table: Sequence[int] = ()
    idx_table: Sequence[int] = ()


class AttnPlan(NamedTuple):
    """Buffers for one launch over a chunk (all int32, on the pools' device).

    pos[q], req[q]: absolute position and request row of query q (q < n_q);
    swa_table[r], comp_table[r], idx_table[r]: block tables, padded with -1;
    sel[q, :top_k]: the indexer's output / sparse attention's input, preset to -1;
    max_pos: the largest query position (sizes the indexer's score row)."""
    pos: torch.Tensor
    req: torch.Tensor
    swa_table: torch.Tensor
    comp_table: torch.Tensor
    idx_table: torch.Tensor
    sel: torch.Tensor
    n_q: int
    top_k: int
    max_pos: int


# fp32 elements one operand tile of a program may hold (32 KB): at D = 512 a 64-row tile would
# neither fit in registers nor, staged for tl.dot beside the queries, in shared memory
TILE = 8192


class Launch(NamedTuple):
    """One kernel launch, fully decided: ``kernel[grid](*args, **constexprs)``."""
    kernel: Callable           # the @triton.jit function
    grid: tuple                # program counts, e.g. (n_q,)
    args: tuple                # runtime arguments in the kernel's order (tensors, ints, floats)
    constexprs: dict[str, Any]  # constexprs (block sizes, modes, head counts) and num_warps

    def run(self):
        self.kernel[self.grid](*self.args, **self.constexprs)


def pow2(n):
    """The smallest power of two >= n (1 for n <= 1): Triton block shapes must be powers of 2."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _pad4(n):
    return max(4, -(-n // 4) * 4)


def _table(rows, device):
    width = _pad4(max((len(r) for r in rows), default=0))
    t = torch.full((len(rows), width), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        if len(r):
            t[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.int32)
    return t.to(device)


def plan_attention(seqs, top_k=0, device="cpu"):
    """Build an AttnPlan for the requests in ``seqs`` (a list of SeqSlice).  Pure host work."""
    pos, req = [], []
    for r, s in enumerate(seqs):
        pos.extend(range(s.start, s.start + s.n_new))
        req.extend([r] * s.n_new)
    n_q = len(pos)
    pos_t = torch.zeros(_pad4(n_q), dtype=torch.int32)
    req_t = torch.zeros(_pad4(n_q), dtype=torch.int32)
    pos_t[:n_q] = torch.as_tensor(pos, dtype=torch.int32)
    req_t[:n_q] = torch.as_tensor(req, dtype=torch.int32)
    k = _pad4(top_k) if top_k else 4
    sel = torch.full((max(n_q, 1), k), -1, dtype=torch.int32)
    return AttnPlan(pos_t.to(device), req_t.to(device),
                    _table([s.swa_table for s in seqs], device),
                    _table([s.comp_table for s in seqs], device),
                    _table([s.idx_table for s in seqs], device),
                    sel.to(device), n_q, int(top_k), max(pos, default=0))
