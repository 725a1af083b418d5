"""vLLM's KV cache groups -> a hybridkv ModelLayout (duck-typed: imports nothing from vLLM).

One vLLM ``KVCacheGroupSpec`` becomes one hybridkv ``LayerGroup`` named ``g<i>`` (its index in
``kv_cache_config.kv_cache_groups``), so group i of every vLLM call is group ``g<i>`` here:

  FullAttentionSpec   -> ``full``: paged over every token, block = the spec's block_size
  SlidingWindowSpec   -> ``swa``: window pages of W' = sliding_window rounded up to a multiple
                         of block_size (a page is W'/block_size vLLM blocks; keeping W' >= W
                         rows is a superset of what the window reads)
  ChunkedLocalAttentionSpec -> ``swa`` with chunked-local attention (``LayerGroup.chunk``,
                         W = the chunk) when the chunk is a multiple of block_size: a query
                         reads its own chunk so far, so a window page holds one chunk and the
                         blocks of the chunks before it are given back as in vLLM; another
                         chunk size keeps the last W' positions (rounded up: a superset)
  MLAAttentionSpec    -> ``full`` (a chain of ``comp`` blocks): a block holds block_size /
                         tokens_per_state compressed entries, every one final once the block's
                         last token is computed (block_size a multiple of tokens_per_state);
                         a resume inside a block copies the open block (hybridkv's exact comp)
  SlidingWindowMLASpec -> ``swa`` like SlidingWindowSpec (its window cached: bounded_replay
                         False; a bounded-replay window, DeepSeek-V4.1, is refused)

DeepSeek-V4 (vLLM packs its layers into physical groups over one block pool; a vLLM group is
one table of block ids, so it is one hybridkv group):
  vLLM group (layers by name suffix)              hybridkv object it holds
  ``.swa_cache`` (SlidingWindowMLA 64, W 128)     ``swa``: the window of every layer
  MLA (256, tps 4 / 128) + ``.indexer.k_cache``   ``comp``: CSA / HCA entries, ``idx`` keys
  ``.compressor.state_cache`` (8, W 128)          ``tail`` of HCA (m' - 1 = 127 rows <= 128)
  ``.compressor.state_cache`` (4, W 8) and        ``tail`` of CSA (m - 1 + overlap m = 7 <= 8)
  ``.indexer.compressor.state_cache`` (4, W 8)    and the indexer's open window (7 <= 8)
vLLM keeps the compressors' open windows as per-token rows in a sliding window (block b holds
positions [b*bs, (b+1)*bs)), so hybridkv holds them as that group's window (rows [H-W, H) at
a resume point H: a superset of the tail's rows), in the same block layout; ``group_roles``
names what a group's layers hold.

The layout's pools are metadata only (vLLM owns the KV tensors): one layer and head_dim 1 per
group.  Any other spec (Mamba, cross-attention, encoder-only, hidden-state caches, sink /
ring-buffer attention, bounded-replay windows, ...) raises UnsupportedSpec naming it: never a
silent fallback.
"""
import math

from hybridkv.errors import LayoutError
from hybridkv.layout import LayerGroup, ModelLayout, ceil_div

SUPPORTED = ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec",
             "MLAAttentionSpec", "SlidingWindowMLASpec")
WINDOWED = {"SlidingWindowSpec": "sliding_window",             # spec -> its window field
            "ChunkedLocalAttentionSpec": "attention_chunk_size",
            "SlidingWindowMLASpec": "sliding_window"}
# layer-name suffix -> what a DeepSeek-V4 layer cache holds (longest suffix first)
ROLES = ((".indexer.compressor.state_cache", "idx open window"),
         (".compressor.state_cache", "tail"), (".indexer.k_cache", "idx keys"),
         (".swa_cache", "swa"))
RETAINED = ("SlidingWindowSpec", "MambaSpec")        # the specs vLLM's retention applies to


class UnsupportedSpec(LayoutError):
    """A vLLM KV cache spec hybridkv cannot manage (the value names the spec and its group)."""


def group_of(i, spec):
    """The LayerGroup of vLLM group ``i`` with ``spec``; UnsupportedSpec when it has none.
    A worker's ``UniformTypeKVCacheSpecs`` maps when all its layers' specs map alike."""
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        mapped = {group_of(i, s) for s in spec.kv_cache_specs.values()}
        if len(mapped) != 1:
            raise UnsupportedSpec("a vLLM group whose layers map to different hybridkv "
                                  "groups", {"group": i, "value": sorted(map(str, mapped))})
        return mapped.pop()
    tokens_per_state = getattr(spec, "tokens_per_state", 1)
    why = ("no hybridkv kind" if name not in SUPPORTED else
           "bounded-replay window (DeepSeek-V4.1)" if getattr(spec, "bounded_replay", False)
           else "block size not a multiple of tokens_per_state"
           if spec.block_size % tokens_per_state else None)
    if why is not None:
        raise UnsupportedSpec("hybridkv cannot manage this vLLM KV cache spec",
                              {"group": i, "spec": name, "why": why,
                               "value": repr(spec)[:200]})
    bs = spec.block_size
    if name in WINDOWED:
        window = getattr(spec, WINDOWED[name])
        chunk = window if name == "ChunkedLocalAttentionSpec" and window % bs == 0 else 0
        return LayerGroup(f"g{i}", "swa", (i,), bs, ceil_div(window, bs) * bs, head_dim=1,
                          chunk=chunk)
    return LayerGroup(f"g{i}", "full", (i,), bs, 0, head_dim=1)


def layout_from_vllm(kv_cache_config):
    """The ModelLayout of a vLLM ``KVCacheConfig`` (see the module docstring)."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        raise UnsupportedSpec("a KVCacheConfig with no kv_cache_groups", kv_cache_config)
    return ModelLayout([group_of(i, g.kv_cache_spec) for i, g in enumerate(groups)],
                       name="vllm")


def group_roles(kv_cache_group):
    """What the layers of one vLLM group hold, by DeepSeek-V4's layer-name suffixes
    (``comp`` for a compressed MLA cache, ``full`` / ``swa`` for plain attention)."""
    spec, roles = kv_cache_group.kv_cache_spec, set()
    for layer in kv_cache_group.layer_names:
        role = next((r for suffix, r in ROLES if layer.endswith(suffix)), None)
        if role is None:
            windowed = type(spec).__name__ in WINDOWED
            role = "swa" if windowed else ("comp" if type(spec).__name__ ==
                                           "MLAAttentionSpec" else "full")
        roles.add(role)
    return tuple(sorted(roles))


def every_n(kv_cache_config, layout, scheduler_block_size):
    """hybridkv's retention interval for vLLM's ``prefix_cache_retention_interval`` (a
    snapshot every that many tokens): ``None`` (dense: vLLM keeps every window block) is a
    window snapshot every W tokens (the least multiple of the hash granule and the smallest
    window W), 0 stays 0 (the semantic points only), a positive one as given.  Dense vLLM
    retains each window block once, W/block_size blocks per W tokens; a hybridkv snapshot
    copies the window's W rows, so one every W tokens retains the same window bytes per token,
    where one every granule would copy each row W/granule times.  The semantic points (branch,
    repeat, boundary, provisional end) keep the granule's precision either way.  Refused with
    ValueError as vLLM refuses it: positive on a config with no sliding-window or Mamba group
    (it would have no effect), negative or not a multiple of the scheduler block size."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", 0)
    retained = any(c.__name__ in RETAINED for g in kv_cache_config.kv_cache_groups
                   for c in type(g.kv_cache_spec).__mro__)
    if interval is None:
        windows = [g.window for g in layout.groups if g.kind == "swa"]
        return math.lcm(layout.granule, min(windows)) if windows else 0
    if interval and not retained:
        raise ValueError(f"prefix_cache_retention_interval ({interval}) is set but the model "
                         "has no sliding-window or Mamba KV cache group: retention has no "
                         "effect (set it to 0)")
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(f"prefix_cache_retention_interval ({interval}) must be non-negative "
                         f"and a multiple of scheduler_block_size ({scheduler_block_size})")
    return ceil_div(interval, layout.granule) * layout.granule


def resume_every(layout, scheduler_block_size):
    """hybridkv's resume stride (``CacheManager(resume_every=)``): vLLM resumes a request at
    whole scheduler blocks, so a decode keeps its end snapshot once per block (the least
    multiple of the block size and the hash granule), not once per granule, and a prompt's
    last block boundary (vLLM's replay boundary) is retained."""
    return math.lcm(scheduler_block_size, layout.granule)


def window_blocks(group):
    """vLLM blocks per hybridkv pool block of ``group`` (a window page spans W'/bs blocks)."""
    return group.window // group.block_size if group.kind == "swa" else 1
