"""vLLM's KV cache groups -> a hybridkv ModelLayout (duck-typed: imports nothing from vLLM).

One vLLM ``KVCacheGroupSpec`` becomes one hybridkv ``LayerGroup`` named ``g<i>`` (its index in
``kv_cache_config.kv_cache_groups``), so group i of every vLLM call is group ``g<i>`` here:

  FullAttentionSpec   -> ``full``: paged over every token, block = the spec's block_size
  SlidingWindowSpec   -> ``swa``: window pages of W' = sliding_window rounded up to a multiple
                         of block_size (a page is W'/block_size vLLM blocks; keeping W' >= W
                         rows is a superset of what the window reads)
  ChunkedLocalAttentionSpec -> ``swa`` with W' = the chunk size rounded up: a query reads its
                         own chunk so far, fewer than W' positions before it (a superset again:
                         hybridkv keeps the last W' positions where vLLM keeps the chunk)

The layout's pools are metadata only (vLLM owns the KV tensors): one layer and head_dim 1 per
group.  Any other spec (Mamba, cross-attention, encoder-only, MLA with compressed states,
...) raises UnsupportedSpec naming it: never a silent fallback.
"""
from hybridkv.errors import LayoutError
from hybridkv.layout import LayerGroup, ModelLayout

SUPPORTED = ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec")
WINDOWED = {"SlidingWindowSpec": "sliding_window",             # spec -> its window field
            "ChunkedLocalAttentionSpec": "attention_chunk_size"}
RETAINED = ("SlidingWindowSpec", "MambaSpec")        # the specs vLLM's retention applies to


class UnsupportedSpec(LayoutError):
    """A vLLM KV cache spec hybridkv cannot manage (the value names the spec and its group)."""


def _ceil(a, b):
    return -(-a // b)


def group_of(i, spec):
    """The LayerGroup of vLLM group ``i`` with ``spec``; UnsupportedSpec when it has none."""
    name = type(spec).__name__
    if name not in SUPPORTED:
        raise UnsupportedSpec("hybridkv cannot manage this vLLM KV cache spec",
                              {"group": i, "spec": name, "value": repr(spec)[:200]})
    bs = spec.block_size
    if name in WINDOWED:
        window = getattr(spec, WINDOWED[name])
        return LayerGroup(f"g{i}", "swa", (i,), bs, _ceil(window, bs) * bs, head_dim=1)
    return LayerGroup(f"g{i}", "full", (i,), bs, 0, head_dim=1)


def layout_from_vllm(kv_cache_config):
    """The ModelLayout of a vLLM ``KVCacheConfig`` (see the module docstring)."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        raise UnsupportedSpec("a KVCacheConfig with no kv_cache_groups", kv_cache_config)
    return ModelLayout([group_of(i, g.kv_cache_spec) for i, g in enumerate(groups)],
                       name="vllm")


def every_n(kv_cache_config, layout, scheduler_block_size):
    """hybridkv's retention interval for vLLM's ``prefix_cache_retention_interval`` (a
    snapshot every that many tokens): ``None`` (dense: vLLM keeps every window block) is every
    hash granule, 0 stays 0 (the semantic points only), a positive one as given.  Refused with
    ValueError as vLLM refuses it: positive on a config with no sliding-window or Mamba group
    (it would have no effect), negative or not a multiple of the scheduler block size."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", 0)
    retained = any(c.__name__ in RETAINED for g in kv_cache_config.kv_cache_groups
                   for c in type(g.kv_cache_spec).__mro__)
    if interval is None:
        return layout.granule if any(g.kind == "swa" for g in layout.groups) else 0
    if interval and not retained:
        raise ValueError(f"prefix_cache_retention_interval ({interval}) is set but the model "
                         "has no sliding-window or Mamba KV cache group: retention has no "
                         "effect (set it to 0)")
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(f"prefix_cache_retention_interval ({interval}) must be non-negative "
                         f"and a multiple of scheduler_block_size ({scheduler_block_size})")
    return _ceil(interval, layout.granule) * layout.granule


def window_blocks(group):
    """vLLM blocks per hybridkv pool block of ``group`` (a window page spans W'/bs blocks)."""
    return group.window // group.block_size if group.kind == "swa" else 1
