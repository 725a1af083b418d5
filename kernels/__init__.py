"""Triton attention kernels with torch references; launches are guarded by the spec."""
import os as _os

import torch as _torch

# Without a GPU the kernels run through Triton's interpreter; it must be chosen before the
# first `import triton` anywhere in the process.
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.guards import (  # noqa: E402
    KERNEL_VERSION, LaunchRefused, PinCheck, GuardedGraph, supported_abi, tensor_abi)
from kernels.plan import AttnPlan, plan_attention  # noqa: E402
from kernels.attention import (  # noqa: E402
    swa_attention, sparse_attention, hca_attention, attention_ref)
from kernels.compressor import CompressSlice, compress, compress_batch, compress_ref  # noqa: E402
from kernels.indexer import index_topk, index_topk_ref  # noqa: E402

__all__ = [
    "KERNEL_VERSION", "LaunchRefused", "PinCheck", "GuardedGraph", "supported_abi", "tensor_abi",
    "AttnPlan", "plan_attention", "swa_attention", "sparse_attention", "hca_attention",
    "attention_ref", "CompressSlice", "compress", "compress_batch", "compress_ref", "index_topk",
    "index_topk_ref",
]
