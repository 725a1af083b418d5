"""Launch-time checks every kernel wrapper runs before it launches.

The rules live in ``spec.funnel`` (ABI equality, byte alignment, the TOCTOU re-check, graph
topology); this module only turns tensors into the values those rules take and raises
``LaunchRefused`` -- carrying the check's name, the offending argument and its value -- when a
rule says no.  A refused launch has written nothing.
"""
from typing import NamedTuple


from spec.funnel import (GPU_ALIGN, AbiDesc, can_hit_abi, can_hit_bytes, can_read_pinned,
                         can_replay)

KERNEL_VERSION = 1
POOL_LAYOUT = "paged[block,row,dim]"


class LaunchRefused(Exception):
    """A launch was refused before anything ran.  ``check`` is one of "abi", "dtype", "layout",
    "bytes", "pinned", "replay", "shape"; ``what`` names the argument; ``value`` is what failed."""

    def __init__(self, check, what, value):
        self.check, self.what, self.value = check, what, value
        super().__init__(f"launch refused by the {check} check on {what}: {value!r}")


class PinCheck(NamedTuple):
    """What the caller pinned (count, version, address epoch) and what is current now."""
    pins: int
    pinned_ver: int
    ver: int
    pinned_ep: int
    ep: int


def pool_abi(pool, kernel_version=KERNEL_VERSION):
    """The ABI a pool tensor actually has; ``kernel_version`` is the one it was written with."""
    return AbiDesc(str(pool.dtype), POOL_LAYOUT, tuple(pool.stride()), int(pool.shape[1]),
                   int(pool.shape[2]), int(kernel_version))


def expected_abi(block_size, head_dim):
    """The ABI this build's kernels read: fp32 [block, row, dim] rows, dense, current version."""
    return AbiDesc("torch.float32", POOL_LAYOUT, (block_size * head_dim, head_dim, 1),
                   int(block_size), int(head_dim), KERNEL_VERSION)


def _round_up(n, a):
    return -(-n // a) * a


def check_bytes(what, t, row=True):
    """Start address aligned; for data tensors each row's bytes are a multiple of GPU_ALIGN
    (vectorised row loads).  Small parameter / index vectors are checked on their address and
    their allocation size, which the allocator rounds up to the alignment."""
    nbytes = t.shape[-1] * t.element_size() if row else _round_up(t.numel() * t.element_size(),
                                                                   GPU_ALIGN)
    if not can_hit_bytes(t.data_ptr(), nbytes, GPU_ALIGN):
        raise LaunchRefused("bytes", what, (t.data_ptr(), nbytes))


def check_pool(what, pool, expected, kernel_version=KERNEL_VERSION):
    """A paged pool: shape [blocks, rows, dim] with exactly the expected ABI, then alignment."""
    if pool.dim() != 3:
        raise LaunchRefused("abi", what, tuple(pool.shape))
    stored = pool_abi(pool, kernel_version)
    if not can_hit_abi(stored, expected):
        raise LaunchRefused("abi", what, stored)
    check_bytes(what, pool)


def check_tensor(what, t, dtype, ndim, row=True):
    """A dense operand: dtype, rank and contiguity, then alignment."""
    if t.dtype != dtype:
        raise LaunchRefused("dtype", what, str(t.dtype))
    if t.dim() != ndim:
        raise LaunchRefused("shape", what, tuple(t.shape))
    if not t.is_contiguous():
        raise LaunchRefused("layout", what, tuple(t.stride()))
    check_bytes(what, t, row)


def check_pins(pins):
    """TOCTOU: every object read by this launch is still pinned, same version, same address."""
    for pc in pins or ():
        if not can_read_pinned(pc.pins, pc.pinned_ver, pc.ver, pc.pinned_ep, pc.ep):
            raise LaunchRefused("pinned", "pin", pc)


def check_same_device(what, *ts):
    devs = {t.device for t in ts}
    if len(devs) != 1:
        raise LaunchRefused("layout", what, sorted(str(d) for d in devs))


class GuardedGraph:
    """A captured graph together with the addresses it captured.

    ``replay(current)`` takes the buffers as they are *now* (name -> tensor, same names as at
    capture) and replays only while every address is unchanged (spec ``can_replay``); after a
    relocation it raises ``LaunchRefused("replay", ...)`` and the caller must re-capture.
    ``replay_fn`` is e.g. ``torch.cuda.CUDAGraph.replay``.
    """

    def __init__(self, replay_fn, buffers):
        self._replay_fn = replay_fn
        self.names = tuple(buffers)
        self.captured = tuple(int(buffers[n].data_ptr()) for n in self.names)

    def replay(self, current):
        if tuple(current) != self.names and set(current) != set(self.names):
            raise LaunchRefused("replay", "buffers", sorted(current))
        now = tuple(int(current[n].data_ptr()) for n in self.names)
        if not can_replay(self.captured, now):
            raise LaunchRefused("replay", "graph", (self.captured, now))
        self._replay_fn()
