"""Launch-time checks every kernel wrapper runs before it launches.

The rules live in ``spec.funnel`` (ABI equality, byte alignment, the TOCTOU re-check, graph
topology); this module only turns tensors into the values those rules take and raises
``LaunchRefused`` -- carrying the check's name, the offending argument and its value -- when a
rule says no.  A refused launch has written nothing.
"""
from spec.funnel import (GPU_ALIGN, POOL_LAYOUT, AbiDesc, PinCheck, can_hit_abi,  # noqa: F401
                         can_hit_bytes, can_pad_blocks, can_read_pinned, can_replay, pool_abi)

KERNEL_VERSION = 1

# What a launch's compute dtype (its queries' / rows' dtype) can read from a pool.  fp32 queries
# read fp32 pools; bf16 queries read bf16 pools or fp8 (e4m3) ones, upcast after the load.
# Arithmetic is fp32 inside every kernel; see kernels/attention.py for the output dtypes.
POOL_DTYPES = {"float32": ("float32",), "bfloat16": ("bfloat16", "float8_e4m3fn")}
ACT_DTYPES = ("float32", "bfloat16")


class LaunchRefused(Exception):
    """A launch was refused before anything ran.  ``check`` is one of "abi", "dtype", "layout",
    "bytes", "pinned", "replay", "shape"; ``what`` names the argument; ``value`` is what failed."""

    def __init__(self, check, what, value):
        self.check, self.what, self.value = check, what, value
        super().__init__(f"launch refused by the {check} check on {what}: {value!r}")


def tensor_abi(pool, kernel_version):
    """The AbiDesc a pool tensor ``[blocks, rows, dim]`` actually has (its objects written by
    kernels of ``kernel_version``): the same vocabulary as the layout's (spec.funnel.pool_abi).
    Its strides are its blocks' layout: a block stride that spec.funnel.can_pad_blocks accepts
    (dense blocks on padded, aligned pages: the arena's) reads as the dense one, since every
    kernel takes ``pool.stride(0)`` as an argument; any other stride, and the row and element
    strides always, are reported as they are."""
    rows, dim = int(pool.shape[1]), int(pool.shape[2])
    strides = tuple(pool.stride())
    size = pool.element_size()
    if can_pad_blocks(strides[0] * size, rows * dim * size):
        strides = (rows * dim, *strides[1:])
    return AbiDesc(dtype_name(pool.dtype), POOL_LAYOUT, strides, rows, dim, int(kernel_version))


def dtype_name(dtype):
    """torch.bfloat16 -> "bfloat16" (the AbiDesc's spelling)."""
    return str(dtype).removeprefix("torch.")


def supported_abi(rows, dim, dtype="float32"):
    """The ABI this build's kernels read: ``dtype`` rows (one of POOL_DTYPES' values), dense
    blocks (any block stride spec.funnel.can_pad_blocks accepts), this kernel version."""
    return pool_abi(dtype, int(rows), int(dim), KERNEL_VERSION)


def check_act(what, t, ndim, row=True):
    """An activation operand (queries, rows to compress): fp32 or bf16, the launch's compute
    dtype; its POOL_DTYPES entry is what the pools of the launch may hold."""
    if dtype_name(t.dtype) not in ACT_DTYPES:
        raise LaunchRefused("dtype", what, str(t.dtype))
    check_tensor(what, t, t.dtype, ndim, row)
    return POOL_DTYPES[dtype_name(t.dtype)]


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


def check_pool(what, pool, abi=None, head_dim=None, dtypes=("float32",)):
    """A paged pool ``[blocks, rows, dim]``: the tensor is what ``abi`` (the AbiDesc the
    cache's layout records for it: funnel layer 2's vocabulary) says, and that is what this
    launch reads (a dtype of ``dtypes``, dense blocks, this kernel version) -- one rule,
    spec.funnel.can_hit_abi, twice -- then alignment.  ``abi`` None: the tensor must simply be
    what the launch reads; ``head_dim``: the row width the launch's queries have; ``dtypes``:
    the pool dtypes the launch's compute dtype reads (POOL_DTYPES), the first if the tensor's
    is none of them (so a pool of another dtype is refused with its actual AbiDesc)."""
    if pool.dim() != 3:
        raise LaunchRefused("abi", what, tuple(pool.shape))
    dt = dtype_name(pool.dtype)
    want = supported_abi(pool.shape[1], pool.shape[2] if head_dim is None else head_dim,
                         dt if dt in dtypes else dtypes[0])
    abi = want if abi is None else abi
    actual = tensor_abi(pool, abi.kernel_version)
    if not can_hit_abi(actual, abi):
        raise LaunchRefused("abi", what, actual)
    if not can_hit_abi(abi, want):
        raise LaunchRefused("abi", what, abi)
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
