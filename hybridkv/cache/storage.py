"""Pool tensors: layer-major ``[n_layers, slots, rows, dim]`` storage whose every block starts on
the GPU block alignment (what funnel layer 4, spec.funnel.can_hit_bytes, checks per block)."""
import torch

from hybridkv.layout import ITEMSIZE, slot_bytes
from spec.funnel import GPU_BLOCK_ALIGN

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def storage(n_layers, slots, rows, dim, dtype, device):
    """A ``[n_layers, slots, rows, dim]`` tensor whose every block starts on GPU_BLOCK_ALIGN
    (rows padded when rows * dim * itemsize is not a multiple of it)."""
    sb = slot_bytes(rows, dim, dtype)
    buf = torch.empty(n_layers * slots * sb + GPU_BLOCK_ALIGN, dtype=torch.uint8, device=device)
    off = (-buf.data_ptr()) % GPU_BLOCK_ALIGN
    raw = buf[off:off + n_layers * slots * sb].view(DTYPES[dtype])
    step = sb // ITEMSIZE[dtype]
    t = raw.as_strided((n_layers, slots, rows, dim), (slots * step, step, dim, 1))
    if t.is_floating_point():
        t.fill_(float("nan"))       # a read of a row nobody wrote poisons the output
    return t
