"""hybridkv's cache event feed -> vLLM's KV events (the one place they translate).

``CacheManager(events=True)`` records a ``CacheEvent`` for every block filed in or taken out of
its prefix index; the adapter drains them right after each call it makes for a vLLM request
(the stored ones are that request's: its commit published them), so the request's token ids,
LoRA and session fill vLLM's ``BlockStored`` without the adapter keeping any request:

  CacheEvent(stored, group g<i>, key, parent, at)  BlockStored(block_hashes=[vLLM's hash of
                                                   the block ending at at, ...],
                                                   parent_block_hash, token_ids of the blocks,
                                                   group_idx=i, the group's spec kind); a run
                                                   of one group's consecutive blocks is one
                                                   event, as vLLM emits them
  CacheEvent(removed, group g<i>, key)             BlockRemoved([the hash key was reported
                                                   under], group_idx=i)
  a fresh CacheManager (reset_prefix_cache)        AllBlocksCleared (the adapter's)

A hybridkv chain block is one vLLM block (full attention); a window snapshot at ``at`` is
reported as the window group's block ending at ``at`` (the state through it is cached).
"""
from vllm.distributed.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                         generate_lookahead_block_hash_extra_keys,
                                         maybe_convert_block_hash, to_event_extra_keys)
from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                        get_kv_cache_spec_sliding_window)


def group_index(name):
    return int(name[1:])                   # layout_from_vllm names group i "g<i>"


class VllmEvents:
    """hybridkv's CacheEvents -> vLLM's KV events, named by vLLM's block hashes.

    A block is reported under the request's ``block_hashes`` entry at its end (vLLM names a
    group block by its last ``hash_block_size`` boundary's hash), with the tokens, extra keys
    and lookahead tokens a consumer rebuilds that hash from; a block vLLM has no hash for yet
    (its lookahead tokens not known) is not reported.  The translation tables: ``hashes``
    (group, hybridkv key) -> the vLLM hash, so a removal names the same hash, and ``keys``
    (group index, vLLM hash) -> (group, key, exact, at), so vLLM's hash names the block cached
    under it (``cached``); hybridkv's keys stay internal.  Both are kept whether or not the
    events are emitted (``emit``), under the request's own hashes: the external form an event
    carries (``maybe_convert_block_hash``, an environment read per call) is made only for the
    events emitted, as vLLM's block pool makes it."""

    def __init__(self, kv_cache_config, hash_block_size, lookahead, emit):
        self.config, self.hash_block_size = kv_cache_config, hash_block_size
        self.lookahead, self.emit = lookahead, emit
        self.hashes, self.keys = {}, {}

    def clear(self):
        self.hashes.clear()
        self.keys.clear()

    def vllm_hash(self, request, at):
        """The request's block hash at its block ending at ``at`` (None: not computed)."""
        i, hashes = at // self.hash_block_size - 1, request.block_hashes
        return hashes[i] if 0 <= i < len(hashes) else None

    def external(self, request, at):
        """``vllm_hash`` as a KV event names it."""
        h = self.vllm_hash(request, at)
        return None if h is None else maybe_convert_block_hash(h)

    def cached(self, block_hash, group_idx):
        """(group, key, exact, at) of the block cached under vLLM hash ``block_hash`` in group
        ``group_idx``, or None."""
        return self.keys.get((group_idx, block_hash))

    def __call__(self, cache_events, request):
        """vLLM's events for CacheEvents (the stored ones published for ``request``): a run
        of one group's consecutive blocks is one BlockStored, as vLLM emits them."""
        out, emit = [], self.emit          # BlockRemoved, or [group index, block ends]
        for e in cache_events:
            i = group_index(e.group)
            if not e.stored:
                h = self.hashes.pop((e.group, e.key), None)
                if h is not None:
                    self.keys.pop((i, h), None)
                    if emit:
                        out.append(BlockRemoved(block_hashes=[maybe_convert_block_hash(h)],
                                                medium=MEDIUM_GPU, group_idx=i))
                continue
            h = self.vllm_hash(request, e.at)
            if h is None:
                continue
            self.hashes[(e.group, e.key)] = h
            self.keys[(i, h)] = (e.group, e.key, e.exact, e.at)
            if not emit:                   # the tables alone
                continue
            bs = self.config.kv_cache_groups[i].kv_cache_spec.block_size
            if out and isinstance(out[-1], list) and out[-1][0] == i and \
                    out[-1][1][-1] == e.at - bs:
                out[-1][1].append(e.at)
            else:
                out.append([i, [e.at]])
        return [self.stored(request, *e) if isinstance(e, list) else e for e in out]

    def extra_keys(self, request, start, end):
        if self.lookahead:
            return generate_lookahead_block_hash_extra_keys(request, start, end,
                                                            end + self.lookahead, 0)[0]
        return generate_block_hash_extra_keys(request, start, end, 0)[0]

    def stored(self, request, i, ends):
        spec, lora = self.config.kv_cache_groups[i].kv_cache_spec, request.lora_request
        bs, tokens = spec.block_size, request.all_token_ids
        return BlockStored(
            block_hashes=[self.external(request, at) for at in ends],
            parent_block_hash=self.external(request, ends[0] - bs),
            token_ids=list(tokens[max(0, ends[0] - bs):ends[-1]]), block_size=bs,
            lora_id=getattr(lora, "adapter_id", None), medium=MEDIUM_GPU,
            lora_name=getattr(lora, "name", None), group_idx=i,
            extra_keys=to_event_extra_keys([self.extra_keys(request, max(0, at - bs), at)
                                            for at in ends]),
            kv_cache_spec_kind=get_kv_cache_spec_kind(spec).value,
            kv_cache_spec_sliding_window=get_kv_cache_spec_sliding_window(spec),
            session_id=getattr(request, "session_id", None),
            lookahead_token_ids=[list(tokens[at:at + self.lookahead]) for at in ends]
            if self.lookahead else None)
