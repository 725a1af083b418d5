"""hybridkv's cache feeds -> vLLM's KV events and worker copies (the one place they translate).

``CacheManager(events=True)`` records a ``CacheEvent`` for every block filed in or taken out of
its prefix index; the adapter drains them right after each call it makes for a vLLM request
(the stored ones are that request's: its commit published them), so the request's token ids,
LoRA and session fill vLLM's ``BlockStored`` without the adapter keeping any request:

  CacheEvent(stored, group g<i>, key, parent, at)  BlockStored(block_hashes=[key, ...],
                                                   parent_block_hash, token_ids of the blocks,
                                                   group_idx=i, the group's spec kind); a run
                                                   of one group's consecutive blocks is one
                                                   event, as vLLM emits them
  CacheEvent(removed, group g<i>, key)             BlockRemoved([key], group_idx=i)
  a fresh CacheManager (reset_prefix_cache)        AllBlocksCleared (the adapter's)

A hybridkv chain block is one vLLM block (full attention); a window snapshot at ``at`` is
reported as the window group's block ending at ``at`` (the state through it is cached).
``Allocation.copies`` (a hit's window restore, per pool block) become vLLM's
``KVCacheBlockCopy`` per vLLM block the page spans.
"""
from hybridkv.integrations.vllm.block_ids import vllm_id
from hybridkv.integrations.vllm.specs import window_blocks
from vllm.distributed.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored
from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                        get_kv_cache_spec_sliding_window)


def group_index(name):
    return int(name[1:])                   # layout_from_vllm names group i "g<i>"


def vllm_events(cache_events, request, kv_cache_config):
    """vLLM's KV events for hybridkv's CacheEvents (stored ones published for ``request``)."""
    out, lora = [], getattr(request, "lora_request", None)
    for e in cache_events:
        i = group_index(e.group)
        if not e.stored:
            out.append(BlockRemoved(block_hashes=[e.key], medium=MEDIUM_GPU, group_idx=i))
            continue
        spec = kv_cache_config.kv_cache_groups[i].kv_cache_spec
        bs, last = spec.block_size, out[-1] if out else None
        tokens = list(request.all_token_ids[max(0, e.at - bs):e.at])
        if isinstance(last, BlockStored) and last.group_idx == i and \
                last.block_hashes[-1] == e.parent:
            last.block_hashes.append(e.key)
            last.token_ids.extend(tokens)
            continue
        out.append(BlockStored(
            block_hashes=[e.key], parent_block_hash=e.parent, token_ids=tokens, block_size=bs,
            lora_id=getattr(lora, "adapter_id", None), medium=MEDIUM_GPU,
            lora_name=getattr(lora, "name", None), group_idx=i,
            kv_cache_spec_kind=get_kv_cache_spec_kind(spec).value,
            kv_cache_spec_sliding_window=get_kv_cache_spec_sliding_window(spec),
            session_id=getattr(request, "session_id", None)))
    return out


def vllm_copies(allocation, layout, per_page):
    """(source id, destination id) per vLLM block of the Allocation's snapshot copies."""
    groups = {g.name: g for g in layout.groups}
    return [(vllm_id(src, j, per_page), vllm_id(dst, j, per_page))
            for _, group, src, dst in allocation.copies
            for j in range(window_blocks(groups[group]))]
