"""Checks of hybridkv's vLLM adapter on vLLM's real objects: run under the vLLM venv by
tests/integrations/test_vllm_adapter.py (this file imports vllm, so it is not named test_*)."""
import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                         maybe_convert_block_hash)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MambaSpec, SlidingWindowSpec)
from vllm.v1.request import Request

from hybridkv import ModelLayout
from hybridkv.integrations.vllm import KVCacheManager, UnsupportedSpec

BS = 16
init_none_hash(sha256)


def full(**kw):
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32,
                             **kw)


def swa(window):
    return SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32,
                             sliding_window=window)


def config(num_blocks, *specs):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"layers.{i}"], s) for i, s in enumerate(specs)])


def manager(num_blocks, *specs):
    return KVCacheManager(config(num_blocks, *specs), max_model_len=4096,
                          scheduler_block_size=BS, hash_block_size=BS)


def request(rid, tokens, salt=None):
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, cache_salt=salt,
                   block_hasher=get_request_block_hasher(BS, sha256))


def vllm_hashes(req):
    return [maybe_convert_block_hash(h) for h in req.block_hashes]


def prefill(kv, req):
    blocks, hit, _ = kv.get_computed_blocks(req)
    got = kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    assert got is not None
    req.num_computed_tokens = req.num_tokens
    return hit


def test_layout_maps_full_and_sliding_window_groups():
    lay = ModelLayout.from_vllm(config(64, full(), swa(40)))
    assert [(g.name, g.kind, g.block_size, g.window) for g in lay.groups] == \
        [("g0", "full", BS, 0), ("g1", "swa", BS, 48)]     # window rounded up to blocks


def test_unsupported_spec_is_named():
    mamba = MambaSpec(block_size=BS, shapes=((1, 1),), dtypes=(torch.float32,))
    with pytest.raises(UnsupportedSpec, match="MambaSpec"):
        ModelLayout.from_vllm(config(64, full(), mamba))


def test_prefix_hit_shares_block_ids_in_one_id_space():
    kv = manager(64, full())
    a, b = request("a", list(range(100))), request("b", list(range(80)) + [7] * 20)
    assert prefill(kv, a) == 0
    assert prefill(kv, b) == 80
    ids_a, ids_b = kv.get_block_ids("a")[0], kv.get_block_ids("b")[0]
    assert ids_b[:5] == ids_a[:5] and set(ids_b[5:]).isdisjoint(ids_a)
    assert all(0 < i < 64 for i in ids_a + ids_b)
    kv.free(a)
    kv.free(b)
    assert kv.usage == 0.0


def test_cache_salt_isolates_tenants():
    kv = manager(64, full())
    prefill(kv, request("a", list(range(64)), salt="tenant-a"))
    assert kv.get_computed_blocks(request("b", list(range(64)), salt="tenant-b"))[1] == 0
    assert kv.get_computed_blocks(request("c", list(range(64)), salt="tenant-a"))[1] == 48


def test_refused_allocation_returns_none_and_changes_nothing():
    kv = manager(9, full())                      # 8 usable blocks
    a = request("a", list(range(100)))
    prefill(kv, a)                               # 7 blocks
    b = request("b", list(range(1000, 1050)))
    free, blocks = kv.block_pool.get_num_free_blocks(), kv.get_block_ids("a")
    assert kv.allocate_slots(b, 50) is None
    assert (kv.block_pool.get_num_free_blocks(), kv.get_block_ids("a")) == (free, blocks)
    assert kv.get_blocks("b").get_block_ids() == ([],)


def test_sliding_window_blocks_outside_the_window_are_null():
    kv = manager(129, full(), swa(32))
    a = request("a", list(range(160)))
    prefill(kv, a)
    for step in range(40):                       # decode: the window slides
        a.append_output_token_ids(5)
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    full_ids, swa_ids = kv.get_block_ids("a")
    assert 0 not in full_ids and swa_ids[0] == 0 and swa_ids[-1] != 0
    assert len(full_ids) == len(swa_ids) == -(-200 // BS)


def test_lookahead_slots_are_never_published():
    kv = manager(64, full())
    a = request("a", list(range(40)))
    blocks, hit, _ = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 40, num_lookahead_tokens=24) is not None
    assert len(kv.get_block_ids("a")[0]) == 4    # 64 positions have slots
    b = request("b", list(range(40)) + list(range(24)))
    assert kv.get_computed_blocks(b)[1] == 32    # only the known prompt's blocks


def test_full_attention_ids_are_arena_pages_plus_one():
    kv = manager(9, full())                      # 8 pages: ids 1..8, id 0 the null block
    a = request("a", list(range(8 * BS)))
    prefill(kv, a)
    assert sorted(kv.get_block_ids("a")[0]) == list(range(1, 9))
    assert kv.block_pool.get_num_free_blocks() == 0


def test_kv_events_follow_what_hybridkv_files_and_drops():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    kv = KVCacheManager(config(5, full()), max_model_len=4096, scheduler_block_size=BS,
                        hash_block_size=BS, enable_kv_cache_events=True)
    a = request("a", list(range(4 * BS)))
    prefill(kv, a)
    kv.cache_blocks(a, a.num_tokens)
    (stored,) = kv.take_events()
    assert isinstance(stored, BlockStored) and len(stored.block_hashes) == 4
    assert stored.token_ids == list(range(4 * BS)) and stored.parent_block_hash is None
    assert stored.group_idx == 0 and stored.kv_cache_spec_kind == "full_attention"
    assert kv.take_events() == [] and kv.block_pool.kv_event_queue == []
    kv.free(a)
    prefill(kv, request("b", list(range(500, 500 + 4 * BS))))   # evicts a's four blocks
    events = kv.take_events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(stored.block_hashes)
    assert stored.block_hashes == vllm_hashes(a)         # vLLM's hashes, not hybridkv's keys
    assert isinstance(events[-1], BlockStored)
    kv.free(request("b", []))
    kv.take_events()
    assert kv.reset_prefix_cache() and kv.take_events() == [AllBlocksCleared()]


def test_a_window_hit_hands_its_capture_and_restore_to_the_worker():
    from dataclasses import replace
    kv = KVCacheManager(replace(config(64, full(), swa(32)), prefix_cache_retention_interval=0),
                        max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS)
    a = request("a", list(range(97)))
    for n in (96, 1):                            # a chunk ends at the window snapshot (96)
        assert kv.allocate_slots(a, n) is not None
        a.num_computed_tokens += n
    captured, kept = kv.take_kv_cache_block_copies()
    a_swa = kv.get_block_ids("a")[1]
    assert captured and {c.src_block_id for c in captured} <= set(a_swa)    # a's window
    assert not {c.dst_block_id for c in captured} & set(a_swa)            # -> its snapshot
    kv.free(a)
    b = request("b", list(range(96)) + [7] * 20)
    blocks, hit, _ = kv.get_computed_blocks(b)
    assert hit == 96
    snapshot = {c.dst_block_id for c in captured}
    in_window = [blk.block_id for blk in blocks.blocks[1] if not blk.is_null]
    assert in_window and set(in_window) <= snapshot          # the hit reads the snapshot
    assert kv.allocate_slots(b, 20, hit, blocks) is not None
    assert kv.get_block_ids("b")[1][:6] == [blk.block_id for blk in blocks.blocks[1]]
    restored, kept = kv.take_kv_cache_block_copies()
    assert restored and {c.src_block_id for c in restored} <= snapshot
    assert not {c.dst_block_id for c in restored} & snapshot
    assert len(kept) == 2 * len(restored) and kv.take_kv_cache_block_copies() == ([], [])


def test_a_chunk_commits_once_and_keeps_a_window_snapshot_per_window():
    """Dense retention (vLLM's default interval): a window snapshot every window (32
    tokens).  The chunk's commit passes them in one hybridkv commit (each captured as it
    passes); the copies name a's window pages as they were, though the commit's slide gives
    them back."""
    kv = manager(256, full(), swa(32))
    a = request("a", list(range(200)))
    commits, commit = [], kv.cache.commit
    kv.cache.commit = lambda *args, **kw: commits.append(args) or commit(*args, **kw)
    assert kv.allocate_slots(a, 160) is not None
    a.num_computed_tokens = 160
    window = set(kv.get_block_ids("a")[1]) - {0}
    assert kv.allocate_slots(a, 40) is not None            # commits the first chunk
    # [0, 31) ran ahead (32, a point, waits for its rows), [31, 160) is one commit past 4
    # points, then the new chunk's [160, 191) runs ahead: not one commit per point
    assert [n for _, n, *_ in commits] == [31, 129, 31]
    captured, _ = kv.take_kv_cache_block_copies()
    assert len(captured) >= 4 and {c.src_block_id for c in captured} <= window
    a.num_computed_tokens = 200
    kv.free(a)
    b = request("b", list(range(100)) + [7] * 20)
    blocks, hit, _ = kv.get_computed_blocks(b)
    assert hit == 96
    in_window = {blk.block_id for blk in blocks.blocks[1] if not blk.is_null}
    assert in_window and in_window <= {c.dst_block_id for c in captured}


def test_a_chunk_wider_than_the_window_gets_real_blocks():
    kv = manager(64, swa(16))
    a = request("a", list(range(100)))
    got = kv.allocate_slots(a, 64)               # positions 0..63 computed by this step
    assert got is not None and 0 not in got.get_block_ids()[0]
    a.num_computed_tokens = 64
    assert kv.allocate_slots(a, 36) is not None   # the first chunk ran: its window slides
    assert kv.get_block_ids("a")[0][:3] == [0, 0, 0]


def test_a_window_takes_its_block_ids_as_positions_reach_them():
    kv = manager(64, swa(64))                    # W' = 64: a window page spans 4 vLLM ids
    a = request("a", list(range(200)))
    free = kv.num_free_blocks()
    got = kv.allocate_slots(a, 16)
    assert got is not None and len(got.get_block_ids()[0]) == 1
    assert free - kv.num_free_blocks() == 1      # that block (the snapshot at 16, written and
    assert kv.cache.snapshots.reclaimable_objects == 1     # not captured, is room still)
    a.num_computed_tokens = 16
    assert kv.ids_needed("a", 16) == 1           # one more block, not the page's other 3
    assert kv.coordinator.get_num_blocks_to_allocate("a", 32) == 1
    assert kv.allocate_slots(a, 144) is not None                  # positions [16, 160)
    a.num_computed_tokens, a.num_in_flight_tokens = 160, 144      # the step still runs
    kv.cache_blocks(a, 160)                      # committed (and captured), nothing slides
    before = kv.num_free_blocks()
    a.num_in_flight_tokens = 0
    kv.remove_skipped_blocks("a", 160)           # queries read [97, 160) from now on
    ids = kv.get_block_ids("a")[0]
    assert [i != 0 for i in ids] == [False] * 4 + [True, False] + [True] * 4
    assert len(set(ids[4:5] + ids[6:])) == 5     # page 1's slot stays until it slides out
    assert kv.num_free_blocks() - before == 5    # page 0's 4 ids and block 5 came back


def test_an_in_flight_step_keeps_the_window_it_reads():
    kv = manager(64, swa(16))
    a = request("a", list(range(100)))
    assert kv.allocate_slots(a, 100) is not None
    a.num_computed_tokens, a.num_in_flight_tokens = 100, 100     # async: still running
    a.append_output_token_ids(5)
    assert kv.allocate_slots(a, 1) is not None
    assert 0 not in kv.get_block_ids("a")[0]
    a.num_in_flight_tokens = 1                                   # the prefill ran
    kv.remove_skipped_blocks("a", 100)
    assert kv.get_block_ids("a")[0][:5] == [0] * 5


def test_external_tokens_get_slots_and_are_cached_once_loaded():
    kv = manager(64, full())
    a = request("a", list(range(80)))
    got = kv.allocate_slots(a, 16, num_external_computed_tokens=64, delay_cache_blocks=True)
    assert got is not None and len(got.get_block_ids()[0]) == 5      # 64 loaded + 16 new
    assert kv.get_computed_blocks(request("b", list(range(80))))[1] == 0   # not landed yet
    a.num_computed_tokens = 64
    kv.cache_blocks(a, 64)                                          # the load landed
    assert kv.get_computed_blocks(request("c", list(range(80))))[1] == 64


def test_lookup_names_the_blocks_the_allocation_keeps():
    kv = manager(64, full())
    a = request("a", list(range(100)))
    prefill(kv, a)
    b = request("b", list(range(64)) + [9] * 10)
    blocks, hit, _ = kv.get_computed_blocks(b)
    assert hit == 64 and blocks.get_block_ids()[0] == kv.get_block_ids("a")[0][:4]
    assert kv.allocate_slots(b, 10, hit, blocks) is not None
    assert kv.get_block_ids("b")[0][:4] == blocks.get_block_ids()[0]
    assert kv.coordinator.single_type_managers[0].req_to_blocks["b"] == \
        kv.get_blocks("b").blocks[0]
    assert "zzz" not in kv.coordinator.single_type_managers[0].req_to_blocks


def test_a_cached_block_is_found_by_its_vllm_hash():
    kv = manager(64, full())
    a = request("a", list(range(48)))
    prefill(kv, a)
    pool = kv.coordinator.single_type_managers[0].block_pool
    (blk,) = pool.get_cached_block(a.block_hashes[1], [0])
    assert blk.block_id == kv.get_block_ids("a")[0][1]
    assert pool.get_cached_block(request("x", [7] * 48).block_hashes[0], [0]) is None


def _cached_by_key(kv, req, i):
    """The oracle of ``get_cached_block`` for each of ``req``'s hash blocks in group i: the
    block hybridkv's index files under the chain key of the block's end, that key made from
    the request's tokens afresh (root key, salt, chain), not from the adapter's names."""
    from hybridkv.cache.index import extend_chain, root_key
    from hybridkv.integrations.vllm.translate import salt_of, token_ids
    n = len(req.block_hashes) * BS
    keys = extend_chain([], root_key(kv.layout, salt_of(req)),
                        token_ids(req, 0, n, BS), kv.layout.granule)
    g, out = kv.layout.groups[i], []
    for j in range(len(req.block_hashes)):
        at = (j + 1) * BS
        ref = kv.cache.cached_block("swa" if g.window else "comp", g.name,
                                    keys[at // kv.layout.granule - 1], bool(g.window))
        out.append(None if ref is None else ref.block)
    return out


@pytest.mark.parametrize("limit", [10 ** 6, 8])
def test_get_cached_block_finds_what_the_index_files_under_each_hash(limit):
    """After every 7th step of a random stream (prefills sharing prefixes, decodes,
    preemption by free, requests freed before any read, eviction under pressure, two
    tenants), ``block_pool.get_cached_block(h, [i])`` names a block exactly where hybridkv's
    index files one under the chain key of h's block end, for every hash of every request
    seen (live or gone).  ``limit`` 8: the names table is pruned all the time (live requests
    named again)."""
    import random
    kv = manager(72, full(), swa(32))
    kv.names.limit = limit
    pool, rnd, seen, live = kv.block_pool, random.Random(7), [], {}
    prefixes = [list(range(p * 100, p * 100 + 64)) for p in range(3)]
    for step in range(60):
        op = rnd.random()
        if op < 0.35 or not live:
            rid = f"r{step}"
            tokens = rnd.choice(prefixes)[:rnd.choice([16, 40, 64])] + \
                [rnd.randrange(5000, 6000) for _ in range(rnd.randrange(1, 40))]
            req = request(rid, tokens, salt=rnd.choice([None, "t"]))
            blocks, hit, _ = kv.get_computed_blocks(req)
            if kv.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
                req.num_computed_tokens = req.num_tokens
                seen.append(req)
                if rnd.random() < 0.3:
                    kv.free(req)           # (gone before any read named it)
                else:
                    live[rid] = req
        elif op < 0.8:
            req = rnd.choice(list(live.values()))
            req.append_output_token_ids(rnd.randrange(5000, 6000))
            if kv.allocate_slots(req, 1) is not None:
                req.num_computed_tokens += 1
        else:
            kv.free(live.pop(rnd.choice(sorted(live))))
        if step % 7 and step != 59:       # (a read names the live requests: not every step)
            continue
        for req in seen:
            for i in (0, 1):
                want = _cached_by_key(kv, req, i)
                for h, b in zip(req.block_hashes, want):
                    got = pool.get_cached_block(h, [i])
                    assert (got is None) == (b is None), (step, req.request_id, i)
    assert any(b is not None for req in seen for b in _cached_by_key(kv, req, 1))


def test_eagle_drops_the_last_matched_block():
    kv = KVCacheManager(config(64, full()), max_model_len=4096, scheduler_block_size=BS,
                        hash_block_size=BS, use_eagle=True)
    prefill(kv, request("a", list(range(3 * BS))))
    assert kv.get_computed_blocks(request("b", list(range(3 * BS))))[1] == BS
    assert prefill(kv, request("c", list(range(3 * BS)) + [7])) == 2 * BS


def test_positive_retention_without_a_window_group_is_refused():
    from dataclasses import replace
    cfg = replace(config(64, full()), prefix_cache_retention_interval=BS)
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS)
    hybrid = replace(config(64, full(), swa(32)), prefix_cache_retention_interval=BS)
    KVCacheManager(hybrid, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS)


def test_dense_retention_keeps_a_window_snapshot_every_window():
    """vLLM's dense retention (None) keeps each window block once; hybridkv's snapshot copies
    the window's W rows, so dense is a snapshot every W tokens (the same window bytes per
    token), not one per block.  A prompt that leaves a cached one between two multiples of W
    resumes at the lower one; where it leaves at the cached prompt's last block boundary (a
    semantic point) it resumes there, to the block."""
    kv = manager(256, full(), swa(64))
    assert kv.kv_cache_config.prefix_cache_retention_interval is None
    assert kv.every_n == 64
    prefill(kv, request("a", list(range(20 * BS + 5))))
    assert prefill(kv, request("b", list(range(9 * BS)) + [7] * 40)) == 8 * BS
    assert prefill(kv, request("c", list(range(20 * BS)) + [9] * 9)) == 20 * BS
    with_granule = KVCacheManager(config(256, full(), swa(BS)), max_model_len=4096,
                                  scheduler_block_size=BS, hash_block_size=BS)
    assert with_granule.every_n == BS                      # a one-block window: every block


def test_kv_events_carry_the_lookahead_hashes_vllm_computes():
    from vllm.distributed.kv_events import BlockStored
    kv = KVCacheManager(config(64, full()), max_model_len=4096, scheduler_block_size=BS,
                        hash_block_size=BS, enable_kv_cache_events=True,
                        num_hash_lookahead_tokens=1)
    a = Request("a", list(range(2 * BS + 1)), SamplingParams(max_tokens=4), None,
                block_hasher=get_request_block_hasher(BS, sha256, 1))
    prefill(kv, a)
    (stored,) = kv.take_events()
    assert isinstance(stored, BlockStored) and stored.block_hashes == vllm_hashes(a)
    assert stored.lookahead_token_ids == [[BS], [2 * BS]] and len(stored.extra_keys) == 2


def test_a_block_is_keyed_by_vllm_s_hash_with_its_lookahead_tokens():
    kv = manager(64, full())

    def req(rid, tokens):
        return Request(rid, tokens, SamplingParams(max_tokens=4), None,
                       block_hasher=get_request_block_hasher(BS, sha256, 1))
    a = req("a", list(range(2 * BS)))                 # block 1's lookahead token not known
    prefill(kv, a)
    assert kv.get_computed_blocks(req("p", list(range(2 * BS)) + [5, 7]))[1] == BS
    a.append_output_token_ids(5)                      # now it is: block 1 is cached
    assert kv.allocate_slots(a, 1) is not None
    assert kv.get_computed_blocks(req("q", list(range(2 * BS)) + [5, 7]))[1] == 2 * BS
    assert kv.get_computed_blocks(req("r", list(range(2 * BS)) + [6, 7]))[1] == BS


def test_blocks_reported_bad_are_never_hit_as_in_stock_vllm():
    """vLLM's Scheduler calls ``evict_blocks`` with a failed KV load's blocks and the ones
    after them (its 'fail' policy) while the request still holds them, then fails the
    request.  No lookup may resume through them: not while held, not after the free.  The
    hit lengths are stock vLLM's on the same calls."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as Stock
    hits = {}
    for side, make in (("ours", KVCacheManager), ("stock", Stock)):
        kv = make(config(64, full()), max_model_len=4096, scheduler_block_size=BS,
                  hash_block_size=BS, enable_caching=True)
        a = request("a", list(range(100)))
        prefill(kv, a)
        ids = kv.get_block_ids("a")[0]
        kv.evict_blocks(set(ids[2:]))                 # the load failed at block 2
        held = kv.get_computed_blocks(request("b", list(range(100))))[1]
        kv.free(a)
        after = kv.get_computed_blocks(request("c", list(range(100))))[1]
        hits[side] = (held, after)
    assert hits["ours"] == hits["stock"] == (32, 32)


def test_a_deferred_free_holds_every_page_until_vllm_hands_the_blocks_back():
    """``pop_blocks_for_free`` (an in-flight step may still write the blocks): nothing
    becomes free or evictable, the request id is reusable at once, and ``free_blocks`` of
    the returned blocks releases them.  The counts are stock vLLM's on the same calls."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as Stock
    seen = {}
    for side, make in (("ours", KVCacheManager), ("stock", Stock)):
        kv = make(config(64, full()), max_model_len=4096, scheduler_block_size=BS,
                  hash_block_size=BS, enable_caching=True)
        start = kv.block_pool.get_num_free_blocks()
        a = request("a", list(range(100)))
        prefill(kv, a)
        running = kv.block_pool.get_num_free_blocks()
        blocks = kv.pop_blocks_for_free(a)
        popped = kv.block_pool.get_num_free_blocks()
        again = request("a", list(range(200, 264)))         # the id comes back at once
        prefill(kv, again)
        both = kv.block_pool.get_num_free_blocks()
        kv.block_pool.free_blocks(reversed(blocks))
        back = kv.block_pool.get_num_free_blocks()
        kv.free(again)
        seen[side] = (start - running, len(blocks), running - popped, popped - both,
                      back - both)
    assert seen["ours"] == seen["stock"] == (7, 7, 0, 4, 7)


def test_a_decode_keeps_its_end_once_per_scheduler_block():
    """hash blocks of 4, a window group of 4-token blocks: a decode's provisional end is kept
    once per scheduler block (vLLM resumes at whole blocks), not once per 4 tokens; a
    scheduler block of 4 keeps it every 4."""
    from dataclasses import replace
    swa4 = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32,
                             sliding_window=32)
    hits = {}
    for block in (4, BS):
        kv = KVCacheManager(replace(config(256, full(), swa4), prefix_cache_retention_interval=0),
                            max_model_len=4096, scheduler_block_size=block, hash_block_size=4)
        assert kv.layout.granule == 4 and kv.cache.snapshots.resume_every == block

        def req(rid, tokens):
            return Request(rid, tokens, SamplingParams(max_tokens=64), None,
                           block_hasher=get_request_block_hasher(4, sha256))
        a = req("a", list(range(40)))
        assert kv.allocate_slots(a, 40) is not None
        a.num_computed_tokens = 40
        for t in range(30):                           # decode positions 40..69
            a.append_output_token_ids(1000 + t)
            assert kv.allocate_slots(a, 1) is not None
            a.num_computed_tokens += 1
        kv.free(a)
        b = req("b", list(range(40)) + [1000 + t for t in range(30)] + [5, 6, 7])
        hits[block] = kv.get_computed_blocks(b)[1]
    assert hits == {4: 68, BS: 64}


def test_chunked_local_attention_gives_back_the_chunks_before_the_current_one():
    """ChunkedLocalAttentionSpec: a query reads its own chunk, so once 100 positions ran the
    blocks of chunks 0-2 (positions < 96) are null, as in vLLM; a chunk that is not a multiple
    of the block keeps the last W' positions (a superset)."""
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

    def chunked(size):
        return ChunkedLocalAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1,
                                         dtype=torch.float32, attention_chunk_size=size)
    g = ModelLayout.from_vllm(config(64, chunked(32))).groups[0]
    assert (g.kind, g.window, g.chunk) == ("swa", 32, 32)
    g = ModelLayout.from_vllm(config(64, chunked(40))).groups[0]
    assert (g.window, g.chunk) == (48, 0)
    kv = manager(64, chunked(32))
    a = request("a", list(range(100)))
    assert kv.allocate_slots(a, 100) is not None
    a.num_computed_tokens = 100
    a.append_output_token_ids(7)
    assert kv.allocate_slots(a, 1) is not None
    ids = kv.get_block_ids("a")[0]
    assert ids[:6] == [0] * 6 and 0 not in ids[6:]


@pytest.mark.parametrize("specs", [(full(),), (full(), swa(40))])
def test_decode_fast_paths_reach_what_the_full_path_reaches(specs):
    """Decode steps through the adapter's fast paths (a layout without a window makes no
    slide-only commit; on full attention a commit waits for the block end; a step reaching
    no new block names none without reading the tables) hand vLLM the blocks and leave the
    cache hitting where the full path does: the same calls against an adapter with the slide
    always sent, every step committed and every step's blocks built from the tables."""
    def drive(kv, forced):
        if forced:
            kv.commits.slides = True
            kv.commits.block_tokens = 1
            kv.blocks.none_new = lambda start, end: False
        calls, got = [], []
        real = kv.cache.commit

        def commit(rid, n, *a, **k):
            out = real(rid, n, *a, **k)
            calls.append((rid, n, kv.cache.requests[rid].num_computed_tokens))
            return out
        kv.cache.commit = commit
        for i in range(3):
            r = request(f"r{i}", list(range(40 + 5 * i)) + [900 + i])
            prefill(kv, r)
            for t in range(37):                         # crosses two or three block ends
                r.append_output_token_ids(2000 + t)
                blocks = kv.allocate_slots(r, 1)
                got.append(blocks.get_block_ids())
                r.num_computed_tokens += 1
            kv.free(r)
        probe = request("p", list(range(40)) + [900] + [2000 + t for t in range(37)] + [7])
        return calls, got, kv.get_computed_blocks(probe)[1]
    fast_calls, fast, fast_hit = drive(manager(256, *specs), False)
    full_calls, slow, full_hit = drive(manager(256, *specs), True)
    assert fast == slow and fast_hit == full_hit > 0
    slides = len(specs) > 1
    assert any(n == 0 for _, n, _ in fast_calls) == slides      # slide-only commits
    assert any(n == 0 for _, n, _ in full_calls)
    fast_commits = [c for c in fast_calls if c[1]]
    full_commits = [c for c in full_calls if c[1]]
    for rid in ("r0", "r1", "r2"):                  # each request commits every position
        ends = [end for r, _, end in fast_commits if r == rid]
        assert ends[-1] == max(end for r, _, end in full_commits if r == rid)
        if not slides:                              # whole blocks, the rest at the free
            assert all(end % BS == 0 for end in ends[:-1])
    if slides:
        assert fast_commits == full_commits
    else:
        assert len(fast_commits) * 4 < len(full_commits)


def _reference_feed(feed, cache_events, request, hashes):
    """The feed's rule, one event at a time (the oracle): a removal pops the key's hash from
    the table; a filing at ``at`` takes the request's hash of the block ending at
    ``at // hash_block_size`` (none: not reported), and emitted filings of one group whose
    ends are one block apart join one entry."""
    out, hbs = [], feed.hash_block_size
    for e in cache_events:
        i = int(e.group[1:])
        if not e.stored:
            h = hashes.pop((e.group, e.key), None)
            if h is not None:
                out.append(("removed", i, maybe_convert_block_hash(h)))
            continue
        j = e.at // hbs - 1
        if not 0 <= j < len(request.block_hashes):
            continue
        h = request.block_hashes[j]
        hashes[(e.group, e.key)] = h
        bs = feed.config.kv_cache_groups[i].kv_cache_spec.block_size
        if out and out[-1][0] == "stored" and out[-1][1] == i and out[-1][2][-1] == e.at - bs:
            out[-1][2].append(e.at)
        else:
            out.append(("stored", i, [e.at]))
    return out


def test_the_event_feed_goes_run_by_run_as_event_by_event():
    """VllmEvents translates a batch run by run (C-speed table updates); on random batches
    (both groups, filings and removals interleaved, keys filed twice, ends past the request's
    hashes and off the block grid) its table and its emitted events are the oracle's."""
    import random
    from types import SimpleNamespace
    from vllm.distributed.kv_events import BlockRemoved
    from hybridkv.cache.request import CacheEvent
    from hybridkv.integrations.vllm.events import VllmEvents
    cfg = config(64, full(), swa(32))
    for seed in range(40):
        rnd = random.Random(seed)
        hbs = rnd.choice([4, 16])
        req = SimpleNamespace(block_hashes=[f"h{seed}-{j}".encode() for j in
                                            range(rnd.randrange(0, 30))])
        feed = VllmEvents(cfg, hbs, 0)
        feed.stored = lambda request, i, ends: ("stored", i, ends)
        hashes = {}
        for _ in range(6):
            batch = []
            for _ in range(rnd.randrange(0, 40)):
                group, key = rnd.choice(["g0", "g1"]), rnd.randrange(12)
                if rnd.random() < 0.4:
                    batch.append(CacheEvent(False, "comp", group, key, None, None, False, None))
                else:
                    at = rnd.randrange(0, 40) * rnd.choice([hbs, 16, 1])
                    batch.append(CacheEvent(True, "comp", group, key, None, at,
                                            rnd.random() < 0.3, "r"))
            got = feed(batch, req)
            got = [("removed", e.group_idx, e.block_hashes[0]) if isinstance(e, BlockRemoved)
                   else e for e in got]
            assert got == _reference_feed(feed, batch, req, hashes), seed
            assert {(g, k): h for g, t in feed.hashes.items() for k, h in t.items()} == hashes


def test_eviction_keeps_a_recent_short_prefix_as_vllm_s_lru_does():
    """The adapter's pools evict by recency (FilteredLRUPolicy, the runtime replay's): a
    short prompt freed after a long one keeps its blocks while the long one's tip goes, as
    vLLM's LRU free queue keeps them.  Greedy-dual (FLOPs per byte) would take the short
    prefix first (its blocks save fewer FLOPs) -- Mooncake's synthetic trace lost half its
    hit tokens to that against stock vLLM."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager as StockManager
    stock = StockManager(config(41, full()), max_model_len=4096, scheduler_block_size=BS,
                         hash_block_size=BS, enable_caching=True)
    for kv in (manager(41, full()), stock):          # 40 usable blocks
        for rid, tokens in (("long", list(range(1000, 1321))), ("short", list(range(65)))):
            r = request(rid, tokens)
            prefill(kv, r)
            kv.free(r)                               # long: 20 blocks, then short: 4
        fresh = request("fresh", list(range(5000, 5289)))
        prefill(kv, fresh)                           # 18 blocks: 2 cached ones go
        kv.free(fresh)
        again = request("again", list(range(65)) + [9] * 40)
        assert kv.get_computed_blocks(again)[1] == 64, type(kv)


def test_the_judge_plugin_installs_our_manager_and_scheduler_where_vllm_names_them():
    """The judge's plugin binds vLLM's ``KVCacheManager`` and ``Scheduler`` names to ours
    (the Scheduler an engine gets with --scheduler-cls), then a test module's own binding
    after collection; AsyncScheduler, defined from the stock class, stays vLLM's."""
    import sys
    import types

    import vllm.v1.core.kv_cache_manager as kv_module
    import vllm.v1.core.sched.scheduler as sched_module
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from hybridkv.integrations.vllm import pytest_plugin
    from hybridkv.integrations.vllm.scheduler import Scheduler
    stock_manager, stock_scheduler = kv_module.KVCacheManager, sched_module.Scheduler
    config = types.SimpleNamespace(addinivalue_line=lambda *a: None)
    late = types.ModuleType("late_test_module")     # a test module importing both by name
    try:
        pytest_plugin.pytest_configure(config)
        assert kv_module.KVCacheManager is KVCacheManager
        assert sched_module.KVCacheManager is KVCacheManager
        assert sched_module.Scheduler is Scheduler
        late.KVCacheManager, late.Scheduler = stock_manager, stock_scheduler
        sys.modules[late.__name__] = late
        pytest_plugin.pytest_collection_finish(types.SimpleNamespace(config=config))
        assert late.KVCacheManager is KVCacheManager and late.Scheduler is Scheduler
        assert issubclass(AsyncScheduler, stock_scheduler)
        assert not issubclass(AsyncScheduler, Scheduler)
    finally:
        sys.modules.pop(late.__name__, None)
        for module in list(sys.modules.values()):
            d = getattr(module, "__dict__", {})
            if d.get("KVCacheManager") is KVCacheManager and module.__name__.startswith("vllm"):
                module.KVCacheManager = stock_manager
            if d.get("Scheduler") is Scheduler and module.__name__.startswith("vllm"):
                module.Scheduler = stock_scheduler
