"""hybridkv's CacheManager behind vLLM 0.33.0's ``KVCacheManager`` interface.

Every decision (the resume point, admission, eviction, what is published) is the CacheManager's;
this class translates vLLM's calls and types onto its public API and keeps only translation
state: per request the positions it handed to hybridkv (``Tracked``), and one ``KVCacheBlock``
object per vLLM block id.

  vLLM                                    hybridkv
  get_computed_blocks(request)            lookup(request_id, prompt[:limit], salt)   (H; with
                                          EAGLE again below H - one block, as vLLM drops it)
  allocate_slots(request, n, ...)         allocate(rid, n + lookahead) (AdmissionRefused ->
                                          None, nothing changed), then commit(rid, k, ids) up
                                          to the tokens known (request.num_tokens)
  cache_blocks(request, n) / free         commit(rid, k, ids) up to n / free(rid)
  block ids                               tables(rid) slots -> id_space.vllm_id
  take_events / take_kv_cache_block_copies  take_events() / Allocation.copies (events.py)
Positions past ``request.num_tokens`` (speculative tokens, lookahead) are allocated and never
committed before their token ids are known: nothing unverified is published, and the ids vLLM's
append-only block table holds stay valid (no hybridkv draft block to release on rejection).  A
request looked up without prefix caching gets a salt of its own: it neither hits nor is hit.
"""
from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused, StaleRead
from hybridkv.integrations.vllm.block_ids import NULL_BLOCK_ID
from hybridkv.integrations.vllm.events import VllmEvents, vllm_copies
from hybridkv.integrations.vllm.facades import (BlockPoolFacade, CoordinatorFacade,
                                                UnusedMachinery)
from hybridkv.integrations.vllm.id_space import id_space
from hybridkv.integrations.vllm.specs import UnsupportedSpec, every_n, layout_from_vllm
from hybridkv.integrations.vllm.translate import (HitMismatch, Tracked, UnusedArgs, cdiv,
                                                  commit_known, salt_of, token_ids)
from vllm.distributed.kv_events import AllBlocksCleared
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, KVCacheBlockCopy
from vllm.v1.metrics.stats import PrefixCacheStats


class KVCacheManager(UnusedMachinery):
    def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                 max_in_flight_tokens=None, enable_caching=True, use_eagle=False,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, log_stats=False,
                 enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1,
                 metrics_collector=None, watermark=0.0,
                 enable_mamba_shared_prefix_checkpoint=False, max_num_seqs=None):
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise UnsupportedSpec("context parallelism", (dcp_world_size, pcp_world_size))
        self.unused = UnusedArgs(max_in_flight_tokens, num_prefill_lookahead, dcp_world_size,
                                 pcp_world_size, metrics_collector)
        self.kv_cache_config, self.max_model_len = kv_cache_config, max_model_len
        self.scheduler_block_size, self.hash_block_size = scheduler_block_size, hash_block_size
        self.enable_caching, self.enable_kv_cache_events = enable_caching, enable_kv_cache_events
        self.log_stats, self.use_eagle = log_stats, use_eagle
        self.feed = VllmEvents(kv_cache_config, hash_block_size, num_hash_lookahead_tokens)
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.layout = layout_from_vllm(kv_cache_config)
        self.ids = id_space(self.layout, kv_cache_config.num_blocks,    # pool blocks <->
                            max_in_flight_tokens, max_num_seqs)         # vLLM block ids
        self.cache = self._new_cache()
        self.num_kv_cache_groups = len(self.layout.groups)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in self.layout.groups))
        self.null_block = KVCacheBlock(NULL_BLOCK_ID, is_null=True)
        self.block_objects = {NULL_BLOCK_ID: self.null_block}   # vLLM id -> its KVCacheBlock
        self.tracked = {}                                       # request id -> Tracked
        self.events = []                                        # vLLM KV events to take
        self.copies = []                                        # (src, dst) ids to take
        self.coordinator = CoordinatorFacade(self)
        self.block_pool = BlockPoolFacade(self)

    def _new_cache(self):
        return CacheManager(self.layout, device="meta",
                            every_n=every_n(self.kv_cache_config, self.layout),
                            events=self.enable_kv_cache_events, **self.ids.cache_kwargs())

    def _drain(self, request):
        """vLLM's events for what the last calls for ``request`` filed / dropped."""
        self.events += self.feed(self.cache.take_events(), request)

    # -- capacity and stats --------------------------------------------------------------------
    def num_free_blocks(self):
        """vLLM block ids an allocation could take now: the ids of the pool blocks free or
        evictable (hybridkv's count)."""
        return self.ids.free_ids(self.cache.available_blocks())

    def ids_needed(self, request_id, num_tokens):
        """vLLM block ids (whole pool blocks) hybridkv needs for ``num_tokens`` more positions."""
        return self.ids.ids_for(self.cache.blocks_needed(request_id, num_tokens))

    @property
    def usage(self):
        """The KV cache usage (0.0 .. 1.0) over vLLM's usable block ids."""
        return 1.0 - self.num_free_blocks() / max(1, self.kv_cache_config.num_blocks - 1)

    def make_prefix_cache_stats(self):
        """The prefix cache stats since the last call (None without log_stats)."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request):
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits):
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                           preempted=request.num_preemptions > 0)

    # -- lookup --------------------------------------------------------------------------------
    def get_computed_blocks(self, request, max_cache_hit_length=None):
        """hybridkv's resume point H for the request's prompt (at most ``num_tokens - 1``:
        the last token is computed for its logits): (blocks, H, 0).  The blocks are
        placeholders (null ids), one per block below H: hybridkv's slots exist only once the
        first allocation pins the plan; ``get_blocks`` then names them."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1 if max_cache_hit_length is None else \
            min(max_cache_hit_length, request.num_tokens - 1)
        hit = self._look(request, limit, salt_of(request)) if limit > 0 else 0
        if hit and self.use_eagle:         # vLLM's EAGLE drops a hit's last matched block
            hit = self._look(request, hit - self.scheduler_block_size, salt_of(request))
        if not hit:
            return self.empty_kv_cache_blocks, 0, 0
        return self._placeholders(hit), hit, 0

    def _look(self, request, limit, salt):
        """hybridkv's resume point <= ``limit`` (it looks up limit + 1 tokens: one to compute)."""
        plan = self.cache.lookup(request.request_id, token_ids(request, 0, limit + 1), salt)
        self.tracked[request.request_id] = Tracked(hit=plan.reuse_tokens)
        return plan.reuse_tokens

    def _placeholders(self, num_tokens):
        return KVCacheBlocks(tuple([self.null_block] * (num_tokens // g.block_size)
                                   for g in self.layout.groups))

    # -- allocation ----------------------------------------------------------------------------
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                       has_scheduled_reqs=True, skip_zeroing_group_ids=()):
        """Slots for ``num_new_tokens`` (+ lookahead) more tokens: the new blocks per group,
        or None with nothing changed when hybridkv's admission refuses."""
        if not (num_new_tokens or num_external_computed_tokens or num_new_computed_tokens):
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        if num_external_computed_tokens or num_encoder_tokens:
            raise UnsupportedSpec("KV connector / encoder tokens",
                                  (num_external_computed_tokens, num_encoder_tokens))
        rid = request.request_id
        computed = request.num_computed_tokens + num_new_computed_tokens
        track = self.tracked.get(rid)
        if track is None or not track.started:
            track = self._first(request, num_new_computed_tokens, computed)
        else:
            commit_known(self.cache, track, request, request.num_computed_tokens)
        regular = min(computed + num_new_tokens, request.num_tokens, self.max_model_len)
        slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        more = max(0, slots - track.allocated)
        if full_sequence_must_fit and not self._fits(request, computed):
            return None
        if (self.watermark_blocks or reserved_blocks) and self._short(
                rid, more, reserved_blocks, request, has_scheduled_reqs):
            return None
        try:
            got = self.cache.allocate(rid, more)
        except (AdmissionRefused, StaleRead):
            self._drain(request)
            return None
        old, track.started, track.allocated = track.allocated, True, got.end
        self.copies += vllm_copies(got, self.layout, self.ids)
        if not delay_cache_blocks:
            commit_known(self.cache, track, request, regular)
        self._drain(request)
        return self._blocks(rid, old, track.allocated)

    def _first(self, request, num_new_computed_tokens, computed):
        """The request's first allocation resumes exactly where vLLM was told it may (a
        fresh lookup when vLLM adopts no hit or another one than the last lookup's)."""
        rid = request.request_id
        track = self.tracked.get(rid)
        if track is None or track.hit != computed:
            if request.num_computed_tokens:
                raise HitMismatch("a first allocation of a request with computed tokens",
                                  (rid, request.num_computed_tokens))
            if computed:
                hit = self._look(request, computed, salt_of(request))
            else:                  # one token: a resume point of 0 (granule > 1)
                salt = salt_of(request) if self.prefix_cache_lookup_enabled(request) else \
                    b"nocache:" + str(rid).encode()
                hit = self._look(request, 0, salt)
            if hit != computed:
                raise HitMismatch("hybridkv cannot resume where vLLM asks", (rid, hit, computed))
            track = self.tracked[rid]
        track.allocated = track.committed = computed
        return track

    def _fits(self, request, computed):
        """The rest of the request fits now (a window holds only the pages it keeps at once)."""
        rest = max(0, min(request.num_tokens, self.max_model_len) - computed)
        need = self.ids.at_once(self.cache.blocks_needed(request.request_id, rest))
        return self.ids.fits(need, self.cache.available_blocks())

    def _short(self, rid, more, reserved_blocks, request, has_scheduled_reqs):
        """vLLM's watermark and reserved blocks, in vLLM ids, on top of hybridkv's admission."""
        from vllm.v1.request import RequestStatus
        watermark = self.watermark_blocks if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING, RequestStatus.PREEMPTED) else 0
        return self.ids_needed(rid, more) + watermark > self.num_free_blocks() - reserved_blocks

    # -- block ids -----------------------------------------------------------------------------
    def _block(self, block_id):
        blk = self.block_objects.get(block_id)
        if blk is None:
            blk = self.block_objects[block_id] = KVCacheBlock(block_id)
        return blk

    def _group_ids(self, tables, g, start_block, end_block):
        """vLLM ids of group g's logical blocks [start_block, end_block) of one request."""
        t, bs = tables[g.name], g.block_size
        if g.kind == "full":
            return [self.ids.vllm_id(("comp", g.name), s) for s in t.comp[start_block:end_block]]
        out, W = [], g.window
        for b in range(start_block, end_block):
            p = b * bs
            slot = t.swa[p // W] if p // W < len(t.swa) else -1
            out.append(NULL_BLOCK_ID if slot < 0 else
                       self.ids.vllm_id(("swa", g.name), slot, p % W // bs))
        return out

    def _blocks(self, rid, start_tokens, end_tokens):
        tables = self.cache.tables(rid)
        groups = tuple([self._block(i) for i in self._group_ids(
            tables, g, cdiv(start_tokens, g.block_size), cdiv(end_tokens, g.block_size))]
            for g in self.layout.groups)
        return KVCacheBlocks(groups) if any(groups) else self.empty_kv_cache_blocks

    def get_blocks(self, request_id):
        """Every block of the request per group (null below a sliding window)."""
        track = self.tracked.get(request_id)
        if track is None or not track.started:
            return self.empty_kv_cache_blocks
        return self._blocks(request_id, 0, track.allocated)

    def get_block_ids(self, request_id):
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id, num_computed_tokens):
        return tuple(ids[:cdiv(num_computed_tokens, g.block_size)]
                     for ids, g in zip(self.get_block_ids(request_id), self.layout.groups))

    def truncate_computed_blocks(self, blocks, num_computed_tokens):
        return KVCacheBlocks(tuple(list(b[:num_computed_tokens // g.block_size])
                                   for b, g in zip(blocks.blocks, self.layout.groups)))

    def estimate_cached_tokens(self, request):
        """Tokens the request resumed from hybridkv's cache."""
        track = self.tracked.get(request.request_id)
        return track.hit if track is not None else 0

    # -- commit and release --------------------------------------------------------------------
    def cache_blocks(self, request, num_computed_tokens):
        """Positions up to ``num_computed_tokens`` are computed: commit them to hybridkv."""
        track = self.tracked.get(request.request_id)
        if track is not None and track.started:
            commit_known(self.cache, track, request, num_computed_tokens)
            self._drain(request)

    def free(self, request):
        """Release the request: its known computed tokens committed, all it holds given
        back; what it published stays cached."""
        track = self.tracked.pop(request.request_id, None)
        if track is None:
            return
        if track.started:
            commit_known(self.cache, track, request, request.num_computed_tokens)
        self.cache.free(request.request_id)
        self._drain(request)

    def reset_prefix_cache(self):
        """Drop every cached block (a fresh CacheManager), only while no request holds any:
        True when reset, False otherwise."""
        if any(t.started for t in self.tracked.values()):
            return False
        self.tracked.clear()
        self.cache, self.feed.hashes = self._new_cache(), {}
        if self.enable_kv_cache_events:
            self.events.append(AllBlocksCleared())
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self):
        """vLLM's KV events since the last call (BlockStored / BlockRemoved /
        AllBlocksCleared), oldest first; none unless enable_kv_cache_events."""
        events, self.events = self.events, []
        return events

    def take_kv_cache_block_copies(self):
        """The window restores of this step's hits for vLLM's worker (source -> destination
        vLLM block), with the blocks they keep."""
        copies, self.copies = self.copies, []
        return ([KVCacheBlockCopy(s, d) for s, d in copies],
                [self._block(i) for pair in copies for i in pair])
