"""Byte and FLOP costs per layout: the one place the benchmark defines them.

Both layouts are the same small model (DESIGN §2 "V4-mini" sizes chosen here): 8 layers, hidden
256, 4 query heads of 64, one shared 64-dim KV head (K = V, as in V4), fp32. Token blocks hold 512
tokens (the Mooncake block size).

`full`   every layer is dense attention over raw KV. A block holds 512 tokens x 8 layers x 64 x 4 B
         = 1 MiB; every block boundary is resumable, so no checkpoints are needed.
`v4-mini` layers 0-1 SWA-only, then CSA (m=4, overlap, indexer) and HCA (m'=128) alternating:
         CSA at 2, 4, 6 and HCA at 3, 5, 7; every layer also keeps a raw window of W=128 tokens.
         Persistent per block (`block_bytes`): CSA entries 3 x 128 x 64 x 4 + indexer keys
         3 x 128 x 32 x 4 + HCA entries 3 x 4 x 64 x 4 = 150,528 B.
         A resumable checkpoint at H (`checkpoint_bytes(H)`) adds what exists only at H: the SWA
         window (8 layers x min(W, H) x 64 x 4) and the open compressor tails (CSA and indexer:
         H%4 rows + 4 overlap rows of fp32 kv+gate; HCA: H%128 rows of fp32 kv+gate). At a block
         boundary that is 262,144 + 9,216 = 271,360 B, about 1.8 blocks.

`--capacity-blocks C` means a byte budget of C x block_bytes: for `full` C blocks, for `v4-mini`
blocks and checkpoints share C x 150,528 B.

FLOPs (`prefix_flops(n)`, a model estimate, used for "FLOPs saved" and by the policy's cost/byte):
dense 2 x params per token (12 d^2 per layer) plus attention 4 x keys x 256 per layer and token,
where keys is the position (full), min(p, W) (SWA), W + top-k 64 + indexer p/4 scoring (CSA),
W + p/128 (HCA).
"""
from __future__ import annotations

from typing import NamedTuple

LAYERS = 8
HIDDEN = 256
KV_DIM = 64
INDEX_DIM = 32
INDEX_HEADS = 4
FP32 = 4
WINDOW = 128
CSA_RATIO, HCA_RATIO, TOPK = 4, 128, 64
N_SWA, N_CSA, N_HCA = 2, 3, 3
BLOCK = 512
_DENSE = 2 * 12 * HIDDEN * HIDDEN * LAYERS     # per token
_ATT = 4 * HIDDEN                              # per key, per layer


class UnknownLayoutError(ValueError):
    """The layout name is not one of LAYOUTS. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"unknown layout {value!r}; choose one of {sorted(LAYOUTS)}")
        self.value = value


class LayoutCost(NamedTuple):
    name: str
    block_bytes: int          # persistent bytes of one 512-token block
    needs_checkpoint: bool    # a hit at H also needs a checkpoint (window + tails) at H

    def checkpoint_bytes(self, h: int) -> int:
        if not self.needs_checkpoint:
            return 0
        swa = LAYERS * min(WINDOW, h) * KV_DIM * FP32
        csa_rows = (h % CSA_RATIO + CSA_RATIO) if h >= CSA_RATIO else h % CSA_RATIO
        tails = N_CSA * csa_rows * (2 * KV_DIM + 2 * INDEX_DIM) * FP32
        tails += N_HCA * (h % HCA_RATIO) * 2 * KV_DIM * FP32
        return swa + tails

    def prefix_flops(self, n: int) -> float:
        """Estimated FLOPs to prefill tokens [0, n)."""
        tri = n * (n - 1) / 2.0                    # sum of positions
        if not self.needs_checkpoint:
            return n * _DENSE + LAYERS * _ATT * tri
        w = min(n, WINDOW)
        win = w * (w - 1) / 2.0 + (n - w) * WINDOW  # sum of min(p, W)
        att = N_SWA * _ATT * win
        att += N_CSA * (_ATT * (win + n * TOPK) + 2 * INDEX_HEADS * INDEX_DIM * tri / CSA_RATIO)
        att += N_HCA * _ATT * (win + tri / HCA_RATIO)
        return n * _DENSE + att

    def span_flops(self, start: int, end: int) -> float:
        """FLOPs of computing tokens [start, end) with [0, start) cached."""
        return self.prefix_flops(end) - self.prefix_flops(start)


FULL = LayoutCost("full", BLOCK * LAYERS * KV_DIM * FP32, False)
V4_MINI = LayoutCost(
    "v4-mini",
    N_CSA * (BLOCK // CSA_RATIO) * (KV_DIM + INDEX_DIM) * FP32
    + N_HCA * (BLOCK // HCA_RATIO) * KV_DIM * FP32,
    True)
LAYOUTS = {"full": FULL, "v4-mini": V4_MINI}


def get_layout(name: str) -> LayoutCost:
    if name not in LAYOUTS:
        raise UnknownLayoutError(name)
    return LAYOUTS[name]
