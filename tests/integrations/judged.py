"""The judge's verdict: every vLLM 0.33.0 test (tests/v1/core) that stock vLLM passes and ours
fails, named with the class of its difference (README, "vLLM with hybridkv").  A failure
raised as ``UnsupportedSpec`` for one of ``REFUSED_SPECS`` is a named refusal and not listed.
Read by tests/integrations/test_vllm_judge.py: a failure not named here, or a named test that
passes, fails that test (the table is kept true)."""

REFUSED_SPECS = ("MambaSpec", "CrossAttentionSpec", "HiSparseResidentSpec", "MLAAttentionSpec",
                 "context parallelism")

CLASSES = {
    "snapshot-pages": "a hybridkv window snapshot is a copy in pages of its own: captured, it "
                      "is evictable and counts as free, where vLLM's immutable window blocks "
                      "double as the cache (the frees themselves match vLLM's: none while the "
                      "step that reads them is in flight)",
    "chunk-as-window": "chunked local attention runs as a window of the chunk size: hybridkv "
                       "keeps the last W' positions (a superset of the chunk, correct), so it "
                       "frees 4 blocks where vLLM frees 6 (vLLM right: less memory)",
    "never-computed": "the test allocates a request and never marks a token computed; vLLM "
                      "caches blocks at allocation (its window blocks are immutable and written "
                      "before attention in the same forward), hybridkv captures window state "
                      "only from rows computed in an earlier step, so it refuses that resume "
                      "(trace: tests/golden/system.can_lookup_6.json, a resume on a WRITING "
                      "window breaks hit_soundness)",
    "snapshot-cost": "dense retention costs a W'/block_size-page snapshot per block boundary "
                     "and a hit restores into fresh pages; two window groups in 19 blocks do "
                     "not fit what vLLM fits by sharing immutable blocks (vLLM right)",
    "window-page": "a window page (W' = window rounded up to block_size) is allocated whole; "
                   "a window wider than the whole KV cache is refused at construction (vLLM "
                   "allocates window blocks one at a time)",
    "id-order": "pins vLLM's free-list order of block ids (group by group); ids are opaque "
                "arena pages in hybridkv (internal)",
    "block-metadata": "reads vLLM's per-block bookkeeping (KVCacheBlock.block_hash / ref_cnt, "
                      "cached_block_hash_to_block, the free queue's order, the event queue, "
                      "the coordinator class): hybridkv keeps that state in its own index and "
                      "pools (internal)",
    "swa-cache-pattern": "checks which sliding-window block hashes vLLM caches (its per-block "
                         "masks); hybridkv caches window snapshots at checkpoints instead "
                         "(internal: hits are checked by the public tests)",
}

NAMED = {
    "test_scheduler.py": {},
    "test_swa_inflight_window_free.py": {
        "test_swa_free_waits_for_in_flight_step": "snapshot-pages",
        "test_chunked_local_free_waits_for_in_flight_step": "chunk-as-window",
    },
    "test_prefix_caching.py": {
        "test_swa_shared_prefix_reuse_under_zero_retention[False]": "never-computed",
        "test_swa_shared_prefix_reuse_under_zero_retention[True]": "never-computed",
        "test_eagle_swa_alignment_caches_extra_block": "never-computed",
        "test_prefill_hybrid_model_combinations_eagle[2g-full+sw]": "never-computed",
        "test_eagle_with_sliding_window": "never-computed",
        "test_eagle_swa_boundary_caches_post_boundary_block": "never-computed",
        "test_eagle_grouped_swa_siblings_use_same_cache_mask": "never-computed",
        "test_different_block_size": "never-computed",
        "test_prefill_hybrid_model_combinations[2g-sw+sw_large]": "snapshot-cost",
        "test_block_stored_event_group_idx_multiple_groups": "window-page",
        "test_cache_hit_local_and_external": "window-page",
        "test_cache_hit_local_and_external_three_groups": "window-page",
        "test_cache_hit_local_and_external_three_groups_preempt_and_reallocate":
            "window-page",
        "test_cache_hit_local_and_external_two_groups_preempt_and_reallocate": "window-page",
        "test_prefill_hybrid_model": "id-order",
        "test_prefill_hybrid_model_eagle": "id-order",
        "test_prefill[sha256]": "block-metadata",
        "test_prefill[sha256_cbor]": "block-metadata",
        "test_prefill_plp": "block-metadata",
        "test_decode": "block-metadata",
        "test_evict": "block-metadata",
        "test_prefill_not_enough_free_blocks_with_computed_blocks": "block-metadata",
        "test_kv_cache_events[2]": "block-metadata",
        "test_kv_cache_events[3]": "block-metadata",
        "test_kv_cache_events[10]": "block-metadata",
        "test_reset_prefix_cache": "block-metadata",
        "test_block_stored_event_group_idx_out_of_bounds": "block-metadata",
        "test_pure_swa_retention_interval_caches_sparse_tails": "block-metadata",
        "test_hybrid_cache_blocks_clamped_to_lcm": "swa-cache-pattern",
        "test_hybrid_cache_blocks_swa_tail_window_only": "swa-cache-pattern",
        "test_hybrid_local_kv_retention_interval_aligns_in_manager": "swa-cache-pattern",
        "test_hybrid_local_kv_retention_latest_only_reuses_replay_boundary":
            "swa-cache-pattern",
        "test_hybrid_local_kv_retention_mtp_reuses_latest_boundary": "swa-cache-pattern",
        "test_pure_swa_retention_latest_only": "swa-cache-pattern",
        "test_swa_free_split_keeps_cached_tail_ahead_of_scratch": "swa-cache-pattern",
    },
}
