"""Blocks whose bytes vLLM reports bad: ``evict_blocks`` after a KV load failed.

vLLM's Scheduler learns from the connector that some block ids were not loaded (their rows
hold garbage) and, unless it recomputes them in place, asks its KV cache manager to drop them
from the prefix cache (``evict_blocks``: the failed blocks and everything after them in each
affected request).  hybridkv's answer, per block id (an arena page: ``page_owner``):

  cached      evicted now with every chain block below it (``CacheManager.evict``): their
              content was computed from it and their keys stay valid for the same tokens
  held        (pinned by a request, or below it something is) kept here as *bad*: a lookup
              never resumes through a bad block (the adapter looks up again below it), and
              each free tries again, so it goes the moment its last holder releases it
  free, gone  nothing to do (its bytes are rewritten before anyone reads them)
"""
from hybridkv.errors import Refused
from hybridkv.integrations.vllm.block_ids import NULL_BLOCK_ID

GONE = ("free",)         # states in which a block holds nothing anyone could hit


class BadBlocks:
    """The bad blocks not evicted yet (ObjRef -> None, in report order)."""

    def __init__(self):
        self.held = {}

    def report(self, cache, block_ids):
        """vLLM's ids of blocks whose bytes are bad: evict each now, or keep it as bad."""
        for block_id in sorted(block_ids):
            if block_id == NULL_BLOCK_ID:
                continue
            ref = cache.page_owner(block_id - 1)
            if ref is not None:
                self.held[ref] = None
        self.retry(cache)

    def retry(self, cache):
        """Evict every bad block that can go now (after a free released its holders)."""
        for ref in list(self.held):
            try:
                cache.evict(*ref)
            except Refused as e:
                if e.value[3] not in GONE:
                    continue
            del self.held[ref]

    def limit(self, plan):
        """The longest resume below every bad block ``plan`` reads (a chain block is not
        needed below its end, a snapshot below its position), or None when it reads none."""
        if not self.held:                       # (the usual case: no bad block at all)
            return None
        ends = [r.at for r in plan.reads if r.ref in self.held]
        return min(ends) - 1 if ends else None

    def clear(self):
        self.held.clear()
