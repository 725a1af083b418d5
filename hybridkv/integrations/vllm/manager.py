"""hybridkv's CacheManager behind vLLM 0.33.0's ``KVCacheManager`` interface.

Every decision (the resume point, admission, eviction, what is published) is the CacheManager's;
this class translates vLLM's calls and types onto its public API and keeps only translation
state: per request the vLLM request and the positions it handed to hybridkv (``Tracked``),
vLLM's block objects (blocks.py), the step's worker copies (copies.py), the hash tables of the
KV events (events.py).

  vLLM                                    hybridkv
  get_computed_blocks(request)            lookup(request_id, prompt[:limit], salt)   (H; with
                                          EAGLE again below H - one block, as vLLM drops it);
                                          the blocks its first allocation keeps
  allocate_slots(request, n, ..., ext)    allocate(rid, ext + n + lookahead) (AdmissionRefused
                                          -> None, nothing changed), then commits (commits.py)
  cache_blocks / remove_skipped_blocks    commits up to the computed tokens / the window slides
  free                                    the computed tokens committed, free(rid)
  block ids                               tables(rid) slots (arena page ids) -> vllm_id
  take_events / take_kv_cache_block_copies  take_events() / commit's and Allocation's copies
  evict_blocks(ids) (a KV load failed)    evict(page_owner(id - 1)) now or once released;
                                          lookups stay below them meanwhile (bad_blocks.py)
Positions past ``request.num_tokens`` (speculative tokens, lookahead) are allocated and never
committed before their token ids are known: nothing unverified is published, and the ids vLLM's
append-only block table holds stay valid (no hybridkv draft block to release on rejection).  A
request looked up without prefix caching gets a salt of its own: it neither hits nor is hit.
"""

from hybridkv.cache import CacheManager
from hybridkv.errors import AdmissionRefused, StaleRead
from hybridkv.integrations.vllm.bad_blocks import BadBlocks
from hybridkv.integrations.vllm.block_ids import block_pages, num_pages
from hybridkv.integrations.vllm.blocks import VllmBlocks
from hybridkv.integrations.vllm.commits import Commits
from hybridkv.integrations.vllm.copies import WorkerCopies
from hybridkv.integrations.vllm.deferred import DeferredFrees
from hybridkv.integrations.vllm.events import VllmEvents
from hybridkv.integrations.vllm.hash_names import HashNames
from hybridkv.integrations.vllm.facades import (BlockPoolFacade, CoordinatorFacade,
                                                UnusedMachinery)
from hybridkv.integrations.vllm.specs import (UnsupportedSpec, every_n, layout_from_vllm,
                                              resume_every)
from hybridkv.integrations.vllm.translate import (HitMismatch, Tracked, TranslatedIds,
                                                  UnusedArgs, known_positions, salt_of)
from hybridkv.layout import ceil_div
from hybridkv.policy import FilteredLRUPolicy
from vllm.distributed.kv_events import AllBlocksCleared
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

MAX_PREPARED_TOKENS = 4_000_000   # prompt tokens waiting prepared on arrival (~20 B each:
#                                   the translated ids, their int64 words, the chain keys)


class KVCacheManager(UnusedMachinery):
    def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                 max_in_flight_tokens=None, enable_caching=True, use_eagle=False,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, log_stats=False,
                 enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1,
                 metrics_collector=None, watermark=0.0,
                 enable_mamba_shared_prefix_checkpoint=False):
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise UnsupportedSpec("context parallelism", (dcp_world_size, pcp_world_size))
        self.unused = UnusedArgs(max_in_flight_tokens, num_prefill_lookahead, dcp_world_size,
                                 pcp_world_size, metrics_collector)
        self.kv_cache_config, self.max_model_len = kv_cache_config, max_model_len
        self.scheduler_block_size, self.hash_block_size = scheduler_block_size, hash_block_size
        self.enable_caching, self.enable_kv_cache_events = enable_caching, enable_kv_cache_events
        self.log_stats, self.use_eagle = log_stats, use_eagle
        self.feed = VllmEvents(kv_cache_config, hash_block_size, num_hash_lookahead_tokens) \
            if enable_kv_cache_events else None                 # vLLM KV events, emitted
        self.prefix_cache_stats = self.new_stats() if log_stats else None
        self.layout = layout_from_vllm(kv_cache_config)
        self.every_n = every_n(kv_cache_config, self.layout, scheduler_block_size)
        self.resume_every = resume_every(self.layout, scheduler_block_size)
        self.block_pages = block_pages(self.layout)      # a window page's vLLM blocks
        self.num_pages = num_pages(kv_cache_config.num_blocks)
        self.cache = self._new_cache()
        self.num_kv_cache_groups = len(self.layout.groups)
        self.names = HashNames(hash_block_size, self.layout.granule,    # get_cached_block's
                               4 * kv_cache_config.num_blocks + 1024)   # vLLM hash -> key
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.blocks = VllmBlocks(self.layout, self.pages_of)    # vLLM's block objects
        self.empty_kv_cache_blocks, self.null_block = self.blocks.empty, self.blocks.null_block
        self.tracked = {}                                       # request id -> Tracked
        self.events = []                                        # vLLM KV events to take
        self.copies = WorkerCopies(self.layout, self.pages_of)  # this step's worker copies
        self.commits = Commits(self.copies, self.layout)
        self.bad = BadBlocks()                                  # bytes reported bad, held
        self.deferred = DeferredFrees()                         # popped, blocks not back yet
        self.prompt_ids = {}                    # request id -> TranslatedIds (lookups reuse)
        self.prepared = {}                      # request id -> prompt tokens: prepared on
        self.prepared_tokens = 0                # arrival, not started yet (and their sum)
        self.block_pool = BlockPoolFacade(self)
        self.coordinator = CoordinatorFacade(self)

    def _new_cache(self):
        """hybridkv's cache on vLLM's ids; every pool under FilteredLRUPolicy, as the runtime
        replay's (recency, rarely reused classes first: at or above LRU, vLLM's order, where
        greedy-dual's FLOPs per byte evicts a short prefix before a long one's tip)."""
        return CacheManager(self.layout, num_pages=self.num_pages, block_pages=self.block_pages,
                            device="meta", every_n=self.every_n, resume_every=self.resume_every,
                            events=self.enable_kv_cache_events,
                            policy_factory=FilteredLRUPolicy)

    def _drain(self, request):
        """vLLM's events for what the last calls for ``request`` filed / dropped (none
        recorded unless they are emitted)."""
        if self.feed is None:
            return
        cache_events = self.cache.take_events()
        if cache_events:                   # (a decode step inside a block files none)
            self.events += self.feed(cache_events, request)

    # -- capacity and stats --------------------------------------------------------------------
    def num_free_blocks(self):
        """vLLM block ids an allocation could take now: the ids of the arena pages free or
        evictable (hybridkv's count, the same for every pool)."""
        return max(self.cache.available_blocks().values())

    def ids_needed(self, request_id, num_tokens):
        """vLLM block ids (arena pages) hybridkv needs now for ``num_tokens`` more positions:
        a window group's only for the sub-blocks the positions reach (vLLM's
        ``get_num_blocks_to_allocate``)."""
        return sum(self.cache.pages_needed(request_id, num_tokens).values())

    def pages_of(self, slot):
        """The arena pages (vLLM ids - 1) of the block at ``slot``."""
        return self.cache.slot_pages(slot)

    @property
    def usage(self):
        """The KV cache usage (0.0 .. 1.0) over vLLM's usable block ids."""
        return 1.0 - self.num_free_blocks() / max(1, self.kv_cache_config.num_blocks - 1)

    # -- lookup --------------------------------------------------------------------------------
    def get_computed_blocks(self, request, max_cache_hit_length=None):
        """hybridkv's resume point H for the request's prompt (at most ``num_tokens - 1``:
        the last token is computed for its logits): (blocks, H, 0).  The blocks are the ones
        the first allocation keeps: the chain blocks read in place, a window group's hit
        window read in place from its snapshot (null below)."""
        self.commits.catch_up(self.cache)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        last = known_positions(request, self._keyed(request)) - 1   # one left to compute
        limit = last if max_cache_hit_length is None else min(max_cache_hit_length, last)
        plan = self._look(request, limit, salt_of(request)) if limit > 0 else None
        if plan is not None and plan.reuse_tokens and self.use_eagle:
            # vLLM's EAGLE drops a hit's last matched block
            plan = self._look(request, plan.reuse_tokens - self.scheduler_block_size,
                              salt_of(request))
        if plan is None or not plan.reuse_tokens:
            return self.empty_kv_cache_blocks, 0, 0
        return self.blocks.of_hit(self.cache, plan, self.tracked[request.request_id].windows), \
            plan.reuse_tokens, 0

    def prepare(self, request):
        """A new request arrived (the Scheduler's ``add_request``): the lookup
        ``get_computed_blocks`` would make, made now, so its prompt's ids are translated and
        checked and its chain keys hashed on arrival -- as vLLM hashes a request's blocks
        when the request is made -- and the lookups of the Scheduler's steps translate and
        hash nothing again.  A lookup only reads the cache; the step looks up again against
        the cache as it is then (the funnel's plan, never this one, is what an allocation
        pins).  At most ``MAX_PREPARED_TOKENS`` prompt tokens wait prepared (their ids and
        keys held): a deeper queue's later arrivals are prepared by the step that first looks
        them up."""
        last = known_positions(request, self._keyed(request)) - 1
        if not self.prefix_cache_lookup_enabled(request) or last <= 0 or \
                self.prepared_tokens + last > MAX_PREPARED_TOKENS:
            return
        self._look(request, last, salt_of(request))
        self.prepared[request.request_id] = last
        self.prepared_tokens += last

    def _unprepared(self, request_id):
        """The request started or left: it no longer waits prepared."""
        self.prepared_tokens -= self.prepared.pop(request_id, 0)

    def _keyed(self, request):
        """vLLM's hash block size when the request's hybridkv ids carry vLLM's block hashes
        (it has a block hasher: prefix caching on), else 0 (its own salt, raw token ids)."""
        hashed = self.enable_caching and getattr(request, "_block_hasher", True) is not None
        return self.hash_block_size if hashed else 0

    def _look(self, request, limit, salt, keyed=None):
        """hybridkv's plan resuming at most at ``limit`` (it looks up limit + 1 tokens: one to
        compute); the request is tracked with the plan's window snapshots."""
        keyed = self._keyed(request) if keyed is None else keyed
        ids = self.prompt_ids.get(request.request_id)
        if ids is None or not ids.fits(request, keyed):
            ids = self.prompt_ids[request.request_id] = TranslatedIds(request, keyed,
                                                                      self.cache.vocab)
        while True:                    # never through a block whose bytes vLLM reported bad
            plan = self.cache.lookup(request.request_id, ids.upto(limit + 1), salt)
            below = self.bad.limit(plan)
            if below is None:
                break
            limit = below
        windows = {ref.group: self.cache.slot(ref)
                   for ref in plan.reads.exact_refs() if ref.kind == "swa"}
        self.tracked[request.request_id] = Tracked(request, plan.reuse_tokens, keyed,
                                                   windows=windows)
        return plan

    # -- allocation ----------------------------------------------------------------------------
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                       has_scheduled_reqs=True, skip_zeroing_group_ids=()):
        """Slots for ``num_new_tokens`` (+ lookahead) more tokens after the local hit and
        the connector's external tokens: the new blocks per group, or None with nothing
        changed when hybridkv's admission refuses."""
        if not (num_new_tokens or num_external_computed_tokens or num_new_computed_tokens):
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        if num_encoder_tokens:
            raise UnsupportedSpec("encoder tokens (cross-attention)", num_encoder_tokens)
        rid = request.request_id
        local = request.num_computed_tokens + num_new_computed_tokens
        computed = min(local + num_external_computed_tokens, self.max_model_len)
        track = self.tracked.get(rid)
        if track is None or not track.started:
            track = self._first(request, num_new_computed_tokens, local)
        else:
            track.target = max(track.target, request.num_computed_tokens)
            self.commits.advance(self.cache, track)
        regular = min(computed + num_new_tokens, request.num_tokens, self.max_model_len)
        slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        more = max(0, slots - track.allocated)
        if full_sequence_must_fit and not self.coordinator.sequence_fits(request, track):
            return None
        if (self.watermark_blocks or reserved_blocks) and self.coordinator.short(
                request, more, reserved_blocks, has_scheduled_reqs):
            return None
        try:
            got = self.cache.allocate(rid, more)
        except (AdmissionRefused, StaleRead):
            self._drain(request)
            return None
        old, track.started, track.allocated = track.allocated, True, got.end
        if got.copies:
            self.copies.restored(got)
        if got.checkpoints:
            self.commits.add_points(track, got.checkpoints)
        if not delay_cache_blocks:
            track.target = max(track.target, regular)
        self.commits.advance(self.cache, track)
        self._drain(request)
        return self._blocks(rid, old, track.allocated)

    def _first(self, request, num_new_computed_tokens, computed):
        """The request's first allocation resumes exactly where vLLM was told it may (a
        fresh lookup when vLLM adopts no hit or another one than the last lookup's)."""
        rid = request.request_id
        self._unprepared(rid)
        track = self.tracked.get(rid)
        if track is None or track.hit != computed:
            if request.num_computed_tokens:
                raise HitMismatch("a first allocation of a request with computed tokens",
                                  (rid, request.num_computed_tokens))
            if computed:
                hit = self._look(request, computed, salt_of(request)).reuse_tokens
            else:                  # one token: a resume point of 0 (granule > 1)
                shared = self.prefix_cache_lookup_enabled(request)
                salt = salt_of(request) if shared else b"nocache:" + str(rid).encode()
                hit = self._look(request, 0, salt, None if shared else 0).reuse_tokens
            if hit != computed:
                raise HitMismatch("hybridkv cannot resume where vLLM asks", (rid, hit, computed))
            track = self.tracked[rid]
        track.request = request
        track.allocated = track.committed = track.target = track.settled = computed
        return track

    # -- block ids -----------------------------------------------------------------------------
    def _blocks(self, rid, start_tokens, end_tokens):
        if self.blocks.none_new(start_tokens, end_tokens):      # a decode step inside blocks
            return self.empty_kv_cache_blocks
        return self.blocks.of_request(self.cache.tables(rid), self.tracked[rid], start_tokens,
                                      end_tokens)

    def get_blocks(self, request_id):
        """Every block of the request per group (null below a sliding window)."""
        track = self.tracked.get(request_id)
        if track is None or not track.started:
            return self.empty_kv_cache_blocks
        return self._blocks(request_id, 0, track.allocated)

    def get_block_ids(self, request_id):
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id, num_computed_tokens):
        return tuple(ids[:ceil_div(num_computed_tokens, g.block_size)]
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
        """Positions up to ``num_computed_tokens`` are computed (an async KV load landed):
        commit them to hybridkv (commits.py)."""
        track = self.tracked.get(request.request_id)
        if track is not None and track.started:
            track.request, track.target = request, max(track.target, num_computed_tokens)
            self.commits.advance(self.cache, track)
            self._drain(request)

    def remove_skipped_blocks(self, request_id, processed_computed_tokens,
                              num_prompt_tokens=None):
        """Positions below ``processed_computed_tokens`` are processed: hybridkv's windows
        slide past what no later query reads (their blocks turn null)."""
        track = self.tracked.get(request_id)
        if track is not None and track.started:
            self.commits.advance(self.cache, track, settled=processed_computed_tokens)
            self._drain(track.request)

    def free(self, request):
        """Release the request: its computed tokens committed (the last checkpoints captured:
        their copies run before the next step, after every step scheduled so far), all it
        holds given back; what it published stays cached."""
        if self._settle(request):
            self.cache.free(request.request_id)
            self._released(request)

    def pop_blocks_for_free(self, request):
        """vLLM's deferred free (deferred.py): the request settled and forgotten like
        ``free``, but everything it holds stays held under a detached handle until vLLM
        hands the returned blocks back (``block_pool.free_blocks``)."""
        blocks = [b for group in self.get_blocks(request.request_id).blocks for b in group
                  if not b.is_null]
        if not blocks:                  # nothing allocated yet: nothing a step could write
            self.free(request)
            return []
        self._settle(request)           # tracked: get_blocks named its blocks
        self.deferred.hold(self.cache.detach(request.request_id),
                           [b.block_id for b in blocks])
        self._drain(request)
        return blocks

    def free_blocks(self, blocks):
        """Blocks vLLM hands back after a deferred free: their detached requests go."""
        for handle in self.deferred.release([b.block_id for b in blocks]):
            self.cache.free(handle)
        self._released(None)

    def _settle(self, request):
        """Commit the request's computed tokens and forget it; False when untracked."""
        track = self.tracked.pop(request.request_id, None)
        self.commits.forget(request.request_id)
        self.prompt_ids.pop(request.request_id, None)
        self._unprepared(request.request_id)
        if track is None:
            return False
        if track.started:
            track.request = request
            track.target = max(track.target, request.num_computed_tokens)
            self.commits.advance(self.cache, track, force=True)
        self.names.leave(self.cache, track)     # (while hybridkv has its keys)
        return True

    def _released(self, request):
        if self.bad.held:
            self.bad.retry(self.cache)
        self._drain(request)

    def evict_blocks(self, block_ids):
        """vLLM's ids of blocks whose bytes a failed KV load left bad: out of the prefix cache
        now, or as soon as their holders release them; no lookup resumes through them
        (bad_blocks.py)."""
        self.bad.report(self.cache, block_ids)
        self._drain(None)

    def reset_prefix_cache(self):
        """Drop every cached block (a fresh CacheManager), only while no request holds any:
        True when reset, False otherwise."""
        if self.deferred or any(t.started for t in self.tracked.values()):
            return False
        self.tracked.clear()
        self.prompt_ids.clear()
        self.prepared.clear()
        self.prepared_tokens = 0
        self.commits.clear()
        self.cache = self._new_cache()
        self.bad.clear()
        self.names.clear()
        if self.feed is not None:
            self.feed.clear()
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
        """This step's window copies for vLLM's worker (captures of checkpoints, restores of
        hits: copies.py), with the blocks they keep."""
        copies = self.copies.take()
        return ([KVCacheBlockCopy(s, d) for s, d in copies],
                [self.blocks.block(i) for pair in copies for i in pair])
