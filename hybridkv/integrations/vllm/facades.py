"""The internals vLLM's Scheduler (and its connectors and tests) read off its KV cache
manager, as thin facades over ours.

``UnusedMachinery`` holds the manager methods for vLLM machinery hybridkv does not use.
The Scheduler reads ``coordinator.single_type_managers`` (``block_size``, ``kv_cache_spec``),
``coordinator.enable_partial_hash_hits``, ``coordinator.get_num_blocks_to_allocate(...)`` and
``block_pool.free_blocks`` / ``get_num_free_blocks``; the auxiliary-output connector a group's
``block_pool.get_cached_block``; vLLM's tests a group's ``req_to_blocks`` /
``num_cached_block`` / ``_null_block`` and the pool's ``free_block_queue.num_free_blocks`` /
``blocks`` (``ref_cnt``: the requests holding each id).  Each answer comes from the adapter's
CacheManager and its translation tables (counts in vLLM block ids); none keeps state.
"""
from collections.abc import Mapping

from hybridkv.integrations.vllm.block_ids import NULL_BLOCK_ID, sub_id
from hybridkv.layout import ceil_div
from vllm.v1.metrics.stats import PrefixCacheStats


class UnusedMachinery:
    """vLLM KVCacheManager methods for vLLM's own bookkeeping (prefix-cache stats) and for
    machinery hybridkv does not use or does elsewhere (the manager's base)."""
    mamba_shared_prefix_checkpoint = False         # no Mamba groups: nothing to share

    @staticmethod
    def new_stats():
        return PrefixCacheStats()

    def make_prefix_cache_stats(self):
        """The prefix cache stats since the last call (None without log_stats)."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, self.new_stats()
        return stats

    def prefix_cache_lookup_enabled(self, request):
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits):
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                           preempted=request.num_preemptions > 0)

    def get_computed_blocks_for_connector(self, request, max_cache_hit_length=None):
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def get_num_common_prefix_blocks(self, running_request_id):
        return [0] * self.num_kv_cache_groups

    def create_kv_cache_blocks(self, blocks):
        return type(self.empty_kv_cache_blocks)(blocks) if any(blocks) else \
            self.empty_kv_cache_blocks

    def take_new_block_ids(self):
        return []

    def record_blocks_for_zeroing(self, request_id, start_token):
        """No-op: no connector load writes into hybridkv's blocks."""

    def take_boundary_state_offloads(self):
        return {}

    def finalize_partial_tail_offloads(self, request):
        return []

    def new_step_starts(self):
        """No-op: hybridkv has no per-step state."""


class RequestView(Mapping):
    """request id -> one group's answer for each request that holds blocks (vLLM's
    ``req_to_blocks`` / ``num_cached_block`` of a single-type manager), read from the adapter
    on every access; ``answer(request_id, track)`` gives the value."""

    def __init__(self, manager, answer):
        self.manager, self.answer = manager, answer

    def __getitem__(self, request_id):
        track = self.manager.tracked.get(request_id)
        if track is None or not track.started:
            raise KeyError(request_id)
        return self.answer(request_id, track)

    def __iter__(self):
        return (rid for rid, t in list(self.manager.tracked.items()) if t.started)

    def __len__(self):
        return sum(1 for _ in self)


class GroupFacade:
    """What the Scheduler (and vLLM's tests) read of one of vLLM's single-type managers:
    the spec, the block size, each request's blocks and how many of them are cached."""

    def __init__(self, manager, group_id, spec):
        self.kv_cache_group_id, self.kv_cache_spec = group_id, spec
        self.block_size = spec.block_size
        self.retains_longer_hit = False
        self.records_new_block_ids = False
        self._null_block = manager.null_block
        self.block_pool = manager.block_pool
        self.req_to_blocks = RequestView(
            manager, lambda rid, _: manager.get_blocks(rid).blocks[group_id])
        self.num_cached_block = RequestView(
            manager, lambda _, track: track.committed // self.block_size)


class CoordinatorFacade:
    def __init__(self, manager):
        self.manager = manager
        self.single_type_managers = tuple(
            GroupFacade(manager, i, g.kv_cache_spec)
            for i, g in enumerate(manager.kv_cache_config.kv_cache_groups))
        self.enable_partial_hash_hits = False
        self.eagle_group_ids = ()
        self.num_reprefillable_tokens = 0
        self.retention_interval = getattr(manager.kv_cache_config,        # as vLLM resolved it
                                          "prefix_cache_retention_interval", None)

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks=None,
                                   num_encoder_tokens=0, total_computed_tokens=0,
                                   num_local_computed_tokens=0, num_tokens_main_model=0,
                                   apply_admission_cap=False, prefill_end=None):
        """vLLM block ids hybridkv needs to hold ``num_tokens`` positions of the request
        (hybridkv's own count for a request it knows; blocks per group otherwise)."""
        m = self.manager
        track = m.tracked.get(request_id)
        if track is None:
            return sum(ceil_div(num_tokens, g.block_size) for g in m.layout.groups)
        return m.ids_needed(request_id, max(0, num_tokens - max(track.allocated, track.hit)))

    def sequence_fits(self, request, track):
        """vLLM's ``full_sequence_must_fit`` gate: the whole sequence fits beside what the
        request holds, a window group counting at most the blocks vLLM's spec caps it at (its
        window recycles blocks during a chunked prefill)."""
        m = self.manager
        rest = max(0, min(request.num_tokens, m.max_model_len) - track.allocated)
        need, total = m.cache.pages_needed(request.request_id, rest), 0
        for g, group in zip(m.layout.groups, m.kv_cache_config.kv_cache_groups):
            ids = need.get(("swa" if g.kind == "swa" else "comp", g.name), 0)
            if g.kind == "swa":
                ids = min(ids, group.kv_cache_spec.max_admission_blocks_per_request(
                    max_in_flight_tokens=m.unused.max_in_flight_tokens or m.max_model_len,
                    max_model_len=m.max_model_len))
            total += ids
        return total <= m.num_free_blocks()

    def short(self, request, more, reserved_blocks, has_scheduled_reqs):
        """vLLM's watermark and reserved blocks, in vLLM ids, on top of hybridkv's admission:
        True when ``more`` positions would eat into them."""
        from vllm.v1.request import RequestStatus
        m = self.manager
        watermark = m.watermark_blocks if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING, RequestStatus.PREEMPTED) else 0
        return m.ids_needed(request.request_id, more) + watermark > \
            m.num_free_blocks() - reserved_blocks


class FreeQueueFacade:
    """vLLM's free block queue, as far as it is read: its length."""

    def __init__(self, manager):
        self.manager = manager

    @property
    def num_free_blocks(self):
        return self.manager.num_free_blocks()


class BlockPoolFacade:
    def __init__(self, manager):
        self.manager = manager
        self.num_gpu_blocks = manager.kv_cache_config.num_blocks
        self.hash_block_size = manager.hash_block_size
        self.null_block = manager.null_block
        self.free_block_queue = FreeQueueFacade(manager)

    def get_num_free_blocks(self):
        return self.manager.num_free_blocks()

    def get_usage(self):
        return self.manager.usage

    @property
    def blocks(self):
        """A fresh KVCacheBlock per vLLM id (the null block first), ``ref_cnt`` the number of
        the adapter's requests whose block tables hold it now."""
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        held = {}
        for rid, track in list(self.manager.tracked.items()):
            if track.started:
                for i in {i for ids in self.manager.get_block_ids(rid) for i in ids}:
                    held[i] = held.get(i, 0) + 1
        return [self.null_block] + [KVCacheBlock(i, ref_cnt=held.get(i, 0))
                                    for i in range(1, self.num_gpu_blocks)]

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        """The block cached under vLLM hash ``block_hash`` in each group, None unless every
        group has one (hybridkv's index, named by vLLM's hash: hash_names.py)."""
        out = [self._cached(block_hash, i) for i in kv_cache_group_ids]
        return None if None in out else out

    def _cached(self, block_hash, group_idx):
        """A window snapshot is named by its block ending at the snapshot's position."""
        m = self.manager
        found = m.names.resolve(m.cache, m.tracked.values(), block_hash)
        g = m.layout.groups[group_idx]
        exact = bool(g.window)                     # a window group caches snapshots
        ref = None if found is None else m.cache.cached_block(
            "swa" if exact else "comp", g.name, found[0], exact)
        if ref is None:
            return None
        sub = (found[1] - 1) % g.window // g.block_size if exact else 0
        block_id = sub_id(m.pages_of(m.cache.slot(ref)), sub)
        return None if block_id == NULL_BLOCK_ID else m.blocks.block(block_id)

    def free_blocks(self, blocks):
        self.manager.free_blocks(blocks)

    def evict_blocks(self, block_ids):
        self.manager.evict_blocks(block_ids)

    def take_events(self):
        return self.manager.take_events()

    @property
    def kv_event_queue(self):
        """The events not taken yet (vLLM's queue of them)."""
        return self.manager.events

    def reset_prefix_cache(self):
        return self.manager.reset_prefix_cache()
