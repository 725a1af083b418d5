"""The vLLM engine state a stream runs on: one model shape's ``KVCacheConfig``, the
``VllmConfig`` around it and a Scheduler built the way vLLM's EngineCore builds it (block sizes
from ``resolve_kv_cache_block_sizes``, the request block hasher from ``get_request_block_hasher``).

Shapes (every group's bytes are metadata here: only block counts matter to the managers):
  full      one FullAttentionSpec group, block 16 (a homogeneous model)
  full+swa  FullAttentionSpec + SlidingWindowSpec (window 128) groups, block 16 (gpt-oss /
            Gemma style hybrids)
  v4        DeepSeek-V4's per-layer specs (``v4_layer_specs``: every layer's window cache, CSA
            and HCA compressed MLA caches, the CSA indexer keys, the compressors' state caches)
            grouped by vLLM's own planner (``get_kv_cache_groups``) into its packed groups over
            one block pool; scheduler block 256, hash block 4
The model config is a small Llama-style ``config.json`` written to a temporary folder (no
download, no tokenizer): the Scheduler reads only lengths and flags from it.
"""
import json
import os
import tempfile

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_planning import (_get_kv_cache_bytes_per_block,
                                            get_kv_cache_config_from_groups,
                                            get_kv_cache_groups)
from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config,
                                         get_request_block_hasher, init_none_hash,
                                         resolve_kv_cache_block_sizes)
from vllm.v1.core.sched.scheduler import Scheduler as StockScheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MLAAttentionSpec, SlidingWindowMLASpec,
                                        SlidingWindowSpec, get_kv_quant_mode)
from vllm.v1.structured_output import StructuredOutputManager

SHAPES = ("full", "full+swa", "v4")
SWA_WINDOW = 128                       # gpt-oss's sliding window
V4_WINDOW = 128                        # DeepSeek-V4's sliding window
# DeepSeek-V4 layer schedule as in the release: the first layers window-only (ratio 0), then
# CSA (ratio 4) and HCA (ratio 128) alternate; 12 layers give vLLM's full packed group set.
V4_RATIOS = (0, 0) + (4, 128) * 5


class UnknownShape(ValueError):
    """A stream shape that is not one of SHAPES (the value is the shape asked for)."""


def model_folder():
    """A folder holding a small Llama-style config.json (the hyperparameters are ours)."""
    folder = tempfile.mkdtemp(prefix="hybridkv-stream-model-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 32000,
              "max_position_embeddings": 1 << 18, "torch_dtype": "bfloat16"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def v4_layer_specs(ratios=V4_RATIOS):
    """Layer name -> vLLM KV cache spec, as vllm/models/deepseek_v4 declares them (fp8_ds_mla
    KV, fp32 compressor states); ratio 0 = window-only layer, 4 = CSA, 128 = HCA."""
    fp8, quant = "fp8_ds_mla", get_kv_quant_mode("fp8_ds_mla")
    specs = {}
    for i, ratio in enumerate(ratios):
        name = f"model.layers.{i}.attn"
        specs[name + ".swa_cache"] = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=torch.uint8,
            sliding_window=V4_WINDOW, cache_dtype_str=fp8, state_content_bytes=584,
            alignment=576, model_version="deepseek_v4", kv_quant_mode=quant)
        if not ratio:
            continue
        specs[name] = MLAAttentionSpec(
            block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=torch.uint8,
            tokens_per_state=ratio, cache_dtype_str=fp8, alignment=576,
            model_version="deepseek_v4", kv_quant_mode=quant, state_content_bytes=584)
        overlap = 2 if ratio == 4 else 1           # CSA compresses with overlap
        specs[name + ".compressor.state_cache"] = SlidingWindowMLASpec(
            block_size=4 if ratio == 4 else 8, num_kv_heads=1, max_tp_shards=1,
            head_size=2 * overlap * 512, dtype=torch.float32,
            sliding_window=overlap * ratio, alignment=576)
        if ratio == 4:
            specs[name + ".indexer.k_cache"] = MLAAttentionSpec(
                block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=132,
                dtype=torch.uint8, tokens_per_state=4, alignment=576)
            specs[name + ".indexer.compressor.state_cache"] = SlidingWindowMLASpec(
                block_size=4, num_kv_heads=1, max_tp_shards=1, head_size=2 * 2 * 128,
                dtype=torch.float32, sliding_window=8, alignment=576)
    return specs


def vllm_config(shape, num_blocks, max_model_len, max_num_seqs, max_num_batched_tokens):
    if shape not in SHAPES:
        raise UnknownShape(f"shape must be one of {SHAPES}: {shape!r}")
    model = ModelConfig(model=model_folder(), skip_tokenizer_init=True, dtype="bfloat16",
                        max_model_len=max_model_len, seed=0)
    scheduler = SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                max_num_batched_tokens=max_num_batched_tokens,
                                enable_chunked_prefill=True, watermark=0.0,
                                is_encoder_decoder=False)
    cache = CacheConfig(block_size=256 if shape == "v4" else 16, enable_prefix_caching=True,
                        cache_dtype="fp8_ds_mla" if shape == "v4" else "auto")
    cache.num_gpu_blocks = num_blocks
    cache.kv_cache_layout = "BLHNC"        # block-outermost: one id spans every group's page
    config = VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache)
    register_all_kvcache_specs(config)
    return config


def kv_cache_config(shape, config, num_blocks):
    """The scheduler's KVCacheConfig of ``shape`` over ``num_blocks`` block ids."""
    if shape == "v4":
        groups = get_kv_cache_groups(config, v4_layer_specs())
        per_block = _get_kv_cache_bytes_per_block(
            groups, config.cache_config.get_resolved_kv_cache_layout())
        worker = get_kv_cache_config_from_groups(config, groups, per_block * num_blocks)
        return generate_scheduler_kv_cache_config([worker])
    shape_kw = dict(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec(["layers.0"], FullAttentionSpec(**shape_kw))]
    if shape == "full+swa":
        groups.append(KVCacheGroupSpec(["layers.1"], SlidingWindowSpec(
            **shape_kw, sliding_window=SWA_WINDOW)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def build_scheduler(side, shape, num_blocks, max_model_len, max_num_seqs=32,
                    max_num_batched_tokens=8192):
    """(scheduler, block hasher for its requests): vLLM's stock Scheduler (side "stock") or
    hybridkv's (side "ours"), over the same configs."""
    if side == "stock":
        cls = StockScheduler
    elif side == "ours":
        from hybridkv.integrations.vllm.scheduler import Scheduler as cls
    else:
        raise ValueError(f"side must be 'stock' or 'ours': {side!r}")
    config = vllm_config(shape, num_blocks, max_model_len, max_num_seqs,
                         max_num_batched_tokens)
    kv_config = kv_cache_config(shape, config, num_blocks)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_config, config)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    scheduler = cls(vllm_config=config, kv_cache_config=kv_config, log_stats=True,
                    structured_output_manager=StructuredOutputManager(config),
                    block_size=block_size, hash_block_size=hash_block_size)
    return scheduler, get_request_block_hasher(hash_block_size, hash_fn)
