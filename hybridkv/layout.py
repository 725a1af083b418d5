"""Model layout: explicit layer groups and the cache objects each group needs.

A ``LayerGroup`` is a set of layers with one attention kind that share block tables:
``swa`` (sliding window only), ``csa`` (ratio-m compression with overlap, optional lightning
indexer) or ``hca`` (ratio-m' compression, no overlap).  Every group keeps an SWA window.
Object kinds per group (spec kinds): swa always; comp and tail for csa/hca; idx when the
group has an indexer (``idx_dim > 0``).

Hit alignment: the prefix index hashes the prompt in granules of GCD(group block sizes); a
resume point H must sit on the granule and, per group, on its block boundary or at a position
that group checkpointed exactly (spec.funnel.can_hit_aligned).  The LCM of the block sizes is
the alignment a design without exact checkpoints would need; a large one is warned about.
"""
import math
import warnings
from typing import NamedTuple

from hybridkv.errors import LayoutError, LayoutWarning
from spec.funnel import AbiDesc

KINDS = ("comp", "tail", "swa", "idx")       # spec.state.KINDS order
GROUP_KINDS = ("swa", "csa", "hca")
LCM_WARN_TOKENS = 4096
DTYPES = ("float32", "float16", "bfloat16")


class LayerGroup(NamedTuple):
    name: str
    kind: str                 # "swa" | "csa" | "hca"
    layers: tuple             # layer indices of the model
    block_size: int           # tokens per block of this group (its page / hash unit)
    window: int               # SWA window W
    ratio: int = 1            # compression ratio m (1 for swa)
    overlap: int = 0          # CSA overlap rows (m), 0 for HCA
    head_dim: int = 16
    idx_dim: int = 0          # > 0: the group has a lightning indexer
    dtype: str = "float32"

    @property
    def compressed(self):
        return self.kind != "swa"

    @property
    def kinds(self):
        out = ("swa",)
        if self.compressed:
            out = ("comp", "tail", "swa")
        if self.idx_dim:
            out += ("idx",)
        return out

    @property
    def entries_per_block(self):
        return self.block_size // self.ratio


def _pos_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise LayoutError(f"{name} must be a positive int", v)


def _check_group(g):
    if not isinstance(g, LayerGroup):
        raise LayoutError("groups must be LayerGroup", g)
    if not isinstance(g.name, str) or not g.name:
        raise LayoutError("group name must be a non-empty str", g.name)
    if g.kind not in GROUP_KINDS:
        raise LayoutError(f"group kind must be one of {GROUP_KINDS}", g.kind)
    if not isinstance(g.layers, tuple) or not g.layers:
        raise LayoutError("layers must be a non-empty tuple", g.layers)
    for name in ("block_size", "window", "ratio", "head_dim"):
        _pos_int(f"{g.name}.{name}", getattr(g, name))
    if g.dtype not in DTYPES:
        raise LayoutError(f"dtype must be one of {DTYPES}", g.dtype)
    if g.kind == "swa" and (g.ratio != 1 or g.overlap or g.idx_dim):
        raise LayoutError("an swa group has ratio 1, no overlap, no indexer", g)
    if g.compressed and g.block_size % g.ratio:
        raise LayoutError("block_size must be a multiple of the ratio", (g.block_size, g.ratio))
    if g.kind == "hca" and (g.overlap or g.idx_dim):
        raise LayoutError("an hca group has no overlap and no indexer", g)
    if g.kind == "csa" and g.overlap not in (0, g.ratio):
        raise LayoutError("csa overlap is 0 or the ratio", g.overlap)


class ModelLayout:
    """Immutable description of the model's cache layout (see module docstring)."""

    def __init__(self, groups, name="custom", kernel_version=1, model_version="0", vocab=None):
        groups = tuple(groups)
        if not groups:
            raise LayoutError("a layout needs at least one group", groups)
        for g in groups:
            _check_group(g)
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise LayoutError("group names must be unique", names)
        layers = [i for g in groups for i in g.layers]
        if len(set(layers)) != len(layers):
            raise LayoutError("a layer belongs to exactly one group", layers)
        if vocab is not None:
            _pos_int("vocab", vocab)
        self.groups, self.name, self.vocab = groups, name, vocab
        self.kernel_version, self.model_version = kernel_version, str(model_version)
        self.granule = math.gcd(*[g.block_size for g in groups])
        self.lcm = math.lcm(*[g.block_size for g in groups])
        if self.lcm > LCM_WARN_TOKENS:
            warnings.warn(f"layout {name}: LCM of group block sizes is {self.lcm} tokens; "
                          f"hits rely on exact checkpoints (granule {self.granule})",
                          LayoutWarning, stacklevel=2)

    @property
    def hit_alignment(self):
        """Effective alignment of a resume point: the hash granule (GCD of block sizes)."""
        return self.granule

    def group(self, name):
        for g in self.groups:
            if g.name == name:
                return g
        raise LayoutError("no such group", name)

    def pool_keys(self):
        """(kind, group name) of every pool, in a fixed order."""
        return [(k, g.name) for g in self.groups for k in KINDS if k in g.kinds]

    def block_shape(self, kind, g):
        """Per-block tensor shape.  comp: E entries per layer; tail: the open window rows
        (max tail_need = m-1+overlap) of kv+gate; swa: a window snapshot of W rows; idx: a
        chain block of E indexer keys or a checkpoint's partial keys + the indexer's own tail."""
        n = len(g.layers)
        if kind == "comp":
            return (n, g.entries_per_block, g.head_dim)
        if kind == "tail":
            width = 2 * g.head_dim if g.kind == "csa" else g.head_dim
            return (n, g.ratio - 1 + g.overlap, 2 * width)
        if kind == "swa":
            return (n, g.window, g.head_dim)
        if kind == "idx":
            return (n, g.entries_per_block + 2 * g.ratio, 2 * g.idx_dim)
        raise LayoutError("no such object kind", kind)

    def abi(self, kind, g, kernel_version=None):
        shape = self.block_shape(kind, g)
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return AbiDesc(g.dtype, f"{kind}/{g.kind}", strides, g.block_size, g.head_dim,
                       self.kernel_version if kernel_version is None else kernel_version)

    def layout_id(self):
        """Bytes naming the layout in every hash (so a different layout never hits)."""
        return repr((self.name, self.groups, self.kernel_version)).encode()

    def __repr__(self):
        return f"ModelLayout({self.name!r}, groups={[g.name for g in self.groups]})"

    @classmethod
    def v4_mini(cls, block_size=None, window=10, head_dim=16, idx_dim=8, csa_ratio=4,
                hca_ratio=8, vocab=256, layers=("swa", "csa", "hca", "csa", "hca")):
        """V4Mini's layout (hybridkv.model defaults: W=10, CSA m=4 with overlap + indexer,
        HCA m'=8; swa blocks of 6 tokens, compressed blocks of 4 entries).  ``block_size``
        sets every group's block to that many tokens instead (e.g. 512 for traces)."""
        bs = {"swa": 6, "csa": 4 * csa_ratio, "hca": 4 * hca_ratio}
        groups = []
        for kind in ("swa", "csa", "hca"):
            ids = tuple(i for i, k in enumerate(layers) if k == kind)
            if not ids:
                continue
            ratio = {"swa": 1, "csa": csa_ratio, "hca": hca_ratio}[kind]
            groups.append(LayerGroup(
                kind, kind, ids, block_size or bs[kind], window, ratio,
                csa_ratio if kind == "csa" else 0, head_dim,
                idx_dim if kind == "csa" else 0))
        return cls(groups, name="v4-mini", vocab=vocab)
