"""The 4-layer hit-validation funnel, the launch-time re-checks, and the fallback.

One function per rule, used alike by the lookup (what may hit), the cache writer (what is
worth caching), the kernel launch wrappers and the prover.  All dual-mode.
"""
from typing import NamedTuple

from spec.dual import And, Eq, If, Mod, Or

GPU_ALIGN = 16          # bytes: vectorised loads on the GPU
GPU_BLOCK_ALIGN = 128   # bytes: start of every pool block
DISK_ALIGN = 4096       # bytes: O_DIRECT / NVMe DMA


POOL_LAYOUT = "paged[block,row,dim]"


class AbiDesc(NamedTuple):
    """What a kernel expects of a stored object.  Strings are compared by equality only."""
    dtype: str
    layout: str
    strides: tuple
    block_size: int
    head_dim: int
    kernel_version: int


class PinCheck(NamedTuple):
    """What a reader pinned (count, version, address epoch) and what is current now: the
    arguments of ``can_read_pinned`` as the cache hands them to a kernel launch."""
    pins: int
    pinned_ver: int
    ver: int
    pinned_ep: int
    ep: int


def pool_abi(dtype, rows, dim, kernel_version):
    """The AbiDesc of one layer's view of a paged pool, ``[blocks, rows, dim]`` dense: what the
    layout records for a pool, what a stored object carries, and what a kernel launch checks
    the tensor it is given against (one vocabulary for funnel layer 2 and the launch).  The
    strides are one block's layout; blocks lying further apart (arena pages) read as this
    same ABI when ``can_pad_blocks`` says their stride is a padded one."""
    return AbiDesc(str(dtype), POOL_LAYOUT, (rows * dim, dim, 1), rows, dim, kernel_version)


def can_pad_blocks(stride_bytes, block_bytes):
    """A pool's blocks lie ``stride_bytes`` apart, each holding a dense block of ``block_bytes``
    followed by padding: at least the block, every block start on GPU_BLOCK_ALIGN (the kernels
    take the block stride as a launch argument)."""
    return And(stride_bytes >= block_bytes, Mod(stride_bytes, GPU_BLOCK_ALIGN) == 0)


# Admission (I1) -----------------------------------------------------------------------------
def can_admit_objects(in_transit, new, cap):
    """I1: ``new`` more objects entering transit (being written, spilled or loaded) keep the
    count within the cap.  Scalar, so the spec, the runtime and the sizing use one rule."""
    return in_transit + new <= cap


def can_bump_indexer(version, max_version, requests_in_flight, indexer_loads):
    """New indexer weights only at a quiescent point: no request in flight and no indexer
    copy being loaded (a load verifies against the version it started under); versions never
    wrap."""
    return And(version < max_version, requests_in_flight == 0, indexer_loads == 0)


# Layer 1 -- whole-block / LCM alignment ------------------------------------------------
def can_hit_aligned(H, granule, block_sizes, partial_ok):
    """H sits on the hash granule (GCD of the group block sizes) and, in every group,
    either on that group's block boundary or at a position that group checkpointed exactly
    (a tail snapshot), so a prompt shorter than the LCM can still hit."""
    return And(Mod(H, granule) == 0,
               *[Or(Mod(H, b) == 0, p) for b, p in zip(block_sizes, partial_ok, strict=True)])


# Layer 2 -- kernel ABI -------------------------------------------------------------------
def can_hit_abi(stored, expected):
    """Stored layout equals the kernel's: dtype, layout, strides, block size, head dim, version."""
    return Eq(tuple(stored), tuple(expected))


# Layer 3 -- multi-group intersection at one H -------------------------------------------
def can_hit_groups(ready_flags):
    """An intersection, never a union: every group must be ready at the same H."""
    return And(*ready_flags)


# Layer 4 -- byte-level hardware alignment ------------------------------------------------
def can_hit_bytes(addr, nbytes, align):
    """Start address and length are multiples of the target's alignment."""
    return And(Mod(addr, align) == 0, Mod(nbytes, align) == 0)


# Launch-time re-checks --------------------------------------------------------------------
def can_read_pinned(pins, pinned_ver, ver, pinned_ep, ep):
    """TOCTOU re-check right before a read: still pinned, same version, same address."""
    return And(pins >= 1, ver == pinned_ver, ep == pinned_ep)


def can_replay(captured_eps, current_eps):
    """A captured graph may replay only while every address it captured is unchanged."""
    return Eq(tuple(captured_eps), tuple(current_eps))


# Fallback --------------------------------------------------------------------------------
def best_hit(candidates, passes):
    """The largest candidate length whose checks all pass (0 when none does)."""
    best = 0
    for h, ok in zip(candidates, passes, strict=True):
        best = If(And(ok, h > best), h, best)
    return best
