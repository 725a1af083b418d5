"""Model checkpoints keyed like the cache's prefix index.

The CacheManager decides *where* a request may resume (HitPlan.reuse_tokens); this store only
holds the model's exported state (``SeqState.checkpoint()``) for positions where the manager has
recorded a checkpoint, under the same salted chain key the manager's index uses, plus the
indexer version (a bump makes every older model checkpoint unreachable, like the manager's).
Each entry carries the chunk schedule that produced it, so a resumed run can be compared with a
cold run of exactly the same chunking.  ``get`` refuses an entry whose tokens differ (a hash
collision would otherwise be a silent wrong answer).
"""
from typing import NamedTuple

from hybridkv.index import extend_chain, root_key


class StoredCheckpoint(NamedTuple):
    H: int
    tokens: tuple        # the H prompt tokens the state was computed from
    ckpt: object         # hybridkv.model.Checkpoint at H
    schedule: tuple      # chunk bounds (a, b) covering [0, H)


def chain_key(cache, tokens, salt, H):
    """The cache index's chain key at H for ``tokens`` under ``salt`` (H on the granule)."""
    gran = cache.layout.granule
    keys = extend_chain([], root_key(cache.layout, salt), list(tokens[:H]), gran)
    return keys[H // gran - 1]


class CheckpointStore:
    def __init__(self, cache):
        self.cache = cache
        self.entries = {}

    def _key(self, tokens, salt, H):
        return (chain_key(self.cache, tokens, salt, H), self.cache.miv)

    def can_land(self, tokens, salt, H):
        """Whether the manager recorded a checkpoint at H for this prefix (hits land only there)."""
        if H <= 0 or H % self.cache.layout.granule:
            return False
        return chain_key(self.cache, tokens, salt, H) in self.cache.index.ckpts

    def put(self, tokens, salt, state, schedule):
        """Store ``state`` (at H = state.length) if the manager has a checkpoint record at H."""
        if not self.can_land(tokens, salt, state.length):
            return False
        return self.put_at(tokens, salt, state.length, state.checkpoint(), schedule)

    def put_at(self, tokens, salt, H, ckpt, schedule):
        """Store an exported checkpoint at H (``schedule`` must end exactly at H)."""
        if ckpt.H != H or not schedule or schedule[-1][1] != H or \
                not self.can_land(tokens, salt, H):
            return False
        self.entries[self._key(tokens, salt, H)] = StoredCheckpoint(
            H, tuple(tokens[:H]), ckpt, tuple(schedule))
        return True

    def get(self, tokens, salt, H):
        e = self.entries.get(self._key(tokens, salt, H))
        if e is None or e.H != H or e.tokens != tuple(tokens[:H]):
            return None
        return e

    def prune(self):
        """Drop entries the manager no longer has a checkpoint record for."""
        live = self.cache.index.ckpts
        miv = self.cache.miv
        dead = [k for k in self.entries if k[0] not in live or k[1] != miv]
        for k in dead:
            del self.entries[k]
        return len(dead)

    def __len__(self):
        return len(self.entries)
