"""vLLM's block objects for hybridkv's slots: one ``KVCacheBlock`` per vLLM id (vLLM compares
blocks by identity and keeps them across steps) and the ``KVCacheBlocks`` of a request or of a
hit, built from hybridkv's block tables and HitPlan through ``block_ids`` (the id rules)."""
from hybridkv.integrations.vllm.block_ids import NULL_BLOCK_ID, group_ids, hit_ids
from hybridkv.layout import ceil_div
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock


class _BlockObjects(dict):
    """vLLM id -> its KVCacheBlock, made the first time an id is named (a lookup of a known
    id stays a plain dict lookup)."""

    def __missing__(self, block_id):
        blk = self[block_id] = KVCacheBlock(block_id)
        return blk


class VllmBlocks:
    def __init__(self, layout, pages_of):
        self.layout, self.pages_of = layout, pages_of   # slot -> the block's arena pages
        self.null_block = KVCacheBlock(NULL_BLOCK_ID, is_null=True)
        self.objects = _BlockObjects({NULL_BLOCK_ID: self.null_block})
        self.empty = KVCacheBlocks(tuple(() for _ in layout.groups))
        self.block_sizes = sorted({g.block_size for g in layout.groups})

    def block(self, block_id):
        return self.objects[block_id]

    def wrap(self, ids_per_group):
        get = self.objects.__getitem__
        groups = tuple(list(map(get, ids)) for ids in ids_per_group)
        return KVCacheBlocks(groups) if any(groups) else self.empty

    def none_new(self, start_tokens, end_tokens):
        """Positions [start_tokens, end_tokens) reach no block past ``start_tokens``' in any
        group (``of_request`` would name none)."""
        return all(-(-start_tokens // bs) >= -(-end_tokens // bs) for bs in self.block_sizes)

    def of_request(self, tables, track, start_tokens, end_tokens):
        """A request's blocks covering positions [start_tokens, end_tokens) per group."""
        return self.wrap(group_ids(g, tables[g.name], self.pages_of, track.hit,
                                   track.windows.get(g.name), ceil_div(start_tokens, g.block_size),
                                   ceil_div(end_tokens, g.block_size))
                         for g in self.layout.groups)

    def of_hit(self, cache, plan, windows):
        """The blocks of a hit at ``plan.reuse_tokens``: what its first allocation keeps."""
        chains = cache.hit_slots(plan)
        return self.wrap(hit_ids(g, chains.get(("comp", g.name), ()), windows.get(g.name),
                                 plan.reuse_tokens, self.pages_of) for g in self.layout.groups)
