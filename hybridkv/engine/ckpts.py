"""Model checkpoints keyed like the cache's prefix index, tied to the manager's objects.

The CacheManager decides *where* a request may resume (HitPlan.reuse_tokens); this store only
holds the model's exported state (``SeqState.checkpoint()``) for positions where the manager has
recorded a checkpoint, under the same salted chain key the manager's index uses, plus the
indexer version (a bump makes every older model checkpoint unreachable, like the manager's).
Each entry carries the chunk schedule that produced it, so a resumed run can be compared with a
cold run of exactly the same chunking.  ``get`` refuses an entry whose tokens differ (a hash
collision would otherwise be a silent wrong answer).

Tie to the manager (``sync``): the model state of a checkpoint lives in memory only while every
object of the manager's checkpoint record is in memory.  Once the manager evicts one (and spills
it), the store writes the intact state to the disk tier (hybridkv.engine.ckptdisk: the tier's
own verified file format) and keeps in memory only a copy whose evicted groups are NaN, like
recycled blocks: ``get`` never offers it; a later plan that resumes there (after the manager
verified its disk loads) gets the state through a verified load of the file, or None (then the
engine recomputes).  ``get(..., lost_ok=True)`` exists only for the seeded ``ignore_plan`` bug.
"""
from collections import Counter
from typing import NamedTuple

from hybridkv.engine import ckptdisk
from hybridkv.index import extend_chain, root_key
from hybridkv.model.cache import Checkpoint, Tail


class StoredCheckpoint(NamedTuple):
    H: int
    tokens: tuple        # the H prompt tokens the state was computed from
    ckpt: object         # hybridkv.model.Checkpoint at H
    schedule: tuple      # chunk bounds (a, b) covering [0, H)
    lost: frozenset = frozenset()   # groups the manager evicted (their tensors are NaN here)
    source: str = "memory"          # memory | disk (came back through a verified load)
    needs: tuple = ()               # the manager's checkpoint record's objects at put time


def chain_key(cache, tokens, salt, H):
    """The cache index's chain key at H for ``tokens`` under ``salt`` (H on the granule)."""
    gran = cache.layout.granule
    keys = extend_chain([], root_key(cache.layout, salt), list(tokens[:H]), gran)
    return keys[H // gran - 1]


def _nan_like(t):
    return None if t is None else t.new_full(t.shape, float("nan"))


def poisoned(ckpt, layers):
    """``ckpt`` with every object of ``layers`` replaced by NaN (new tensors)."""
    out = []
    for i, lc in enumerate(ckpt.layers):
        if i in layers:
            tl = [None if t is None else Tail(t.start, _nan_like(t.kv), _nan_like(t.gate))
                  for t in (lc.tail, lc.idx_tail)]
            lc = lc._replace(swa_rows=_nan_like(lc.swa_rows), comp=_nan_like(lc.comp),
                             idx=_nan_like(lc.idx), tail=tl[0], idx_tail=tl[1])
        out.append(lc)
    return Checkpoint(ckpt.H, tuple(out))


class CheckpointStore:
    def __init__(self, cache, model=None, disk=None):
        """``disk``: a DiskTier for spilled model state (default: the manager's own tier);
        ``model`` gives the config and the weights fingerprint of the files' ABI id."""
        self.cache = cache
        self.disk = getattr(cache, "disk", None) if disk is None else disk
        self.cfg = model.cfg if model is not None else None
        self.tag = ckptdisk.model_fingerprint(model) if model is not None and \
            self.disk is not None else 0
        self.device = getattr(model, "device", "cpu")
        self.entries = {}
        self.counts = Counter()

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
        k = self._key(tokens, salt, H)
        self.entries[k] = StoredCheckpoint(H, tuple(tokens[:H]), ckpt, tuple(schedule),
                                           needs=self.cache.index.ckpts[k[0]].needs)
        return True

    def get(self, tokens, salt, H, lost_ok=False):
        """The intact state at H for this prefix: from memory, else through a verified load
        of its disk file; None when neither has it (the caller recomputes)."""
        k = self._key(tokens, salt, H)
        e = self.entries.get(k)
        if e is not None and (e.H != H or e.tokens != tuple(tokens[:H])):
            return None
        if e is not None and (not e.lost or lost_ok):
            return e
        d = self._load(k, tokens, H)
        if d is not None:
            self.entries[k] = d
        return d

    # -- the disk side ---------------------------------------------------------------------
    def _dkey(self, k):
        return ckptdisk.disk_key(k[0], k[1], self.tag)

    def _on_disk(self, needs):
        """Whether the manager has a disk copy of any of ``needs`` (else a plan can never
        come back to this checkpoint through the disk, and its file would be dead weight)."""
        link = self.cache.disk_link
        return link is not None and any(
            link.state(link.key_for(n.key, n.kind)) in ("on_disk", "verified", "loading")
            for n in needs)

    def _spill(self, k, e, needs=None):
        if self.disk is None or self.cfg is None or e.lost or \
                (needs is not None and not self._on_disk(needs)):
            return False
        ok = ckptdisk.spill(self.disk, self._dkey(k), ckptdisk.meta(self.cfg, e.H, k[1],
                                                                    self.tag),
                            e.ckpt, e.tokens, e.schedule)
        self.counts["spilled" if ok else "spill_failed"] += 1
        return ok

    def _load(self, k, tokens, H):
        if self.disk is None or self.cfg is None or k[1] != self.cache.miv:
            return None
        key = self._dkey(k)
        if self.disk.state(key) not in ("on_disk", "verified"):
            return None
        d, why = ckptdisk.load(self.disk, self.cfg, key, ckptdisk.meta(self.cfg, H, k[1],
                                                                       self.tag), H,
                               self.device)
        if d is None or d.tokens != tuple(tokens[:H]):
            self.counts["load_failed"] += 1
            self.counts["load_failed:" + (why.split(":")[0] if d is None else "tokens")] += 1
            return None
        self.counts["loaded"] += 1
        return StoredCheckpoint(H, d.tokens, d.ckpt, d.schedule, source="disk")

    def spill_all(self):
        """Write every intact entry to the disk tier (memory copies stay)."""
        return sum(self._spill(k, e) for k, e in list(self.entries.items()))

    # -- keeping in step with the manager ----------------------------------------------------
    def sync(self):
        """Demote every entry whose manager checkpoint lost an object (see module doc);
        returns how many were demoted."""
        index, n = self.cache.index, 0
        groups = {g.name: set(g.layers) for g in self.cache.layout.groups}
        for k, e in list(self.entries.items()):
            ck = index.ckpts.get(k[0])
            if e.lost or ck is None or k[1] != self.cache.miv:
                continue
            gone = [x for x in ck.needs if index.get(x.kind, x.group, x.key) is None]
            lost = frozenset(x.group for x in gone)
            if lost:
                self._spill(k, e, gone)
                layers = set().union(*(groups[g] for g in lost))
                self.entries[k] = e._replace(ckpt=poisoned(e.ckpt, layers), lost=lost)
                self.counts["demoted"] += 1
                n += 1
        return n

    def prune(self):
        """Drop entries the manager no longer has a checkpoint record for (intact ones go to
        the disk tier first: the manager may still find its objects there)."""
        live = self.cache.index.ckpts
        miv = self.cache.miv
        dead = [k for k in self.entries if k[0] not in live or k[1] != miv]
        for k in dead:
            e = self.entries[k]
            if k[1] == miv:
                self._spill(k, e, [n for n in e.needs if n.exact])
            del self.entries[k]
        return len(dead)

    def __len__(self):
        return len(self.entries)
