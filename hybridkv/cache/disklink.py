"""The manager's link to a DiskTier: spills of evicted blocks, verified loads into pool blocks,
and the disk side of a lookup.  One format: a spill is a block's rows (every tensor, every
layer: ``Pool.to_bytes``), a load writes them back into a pool block (``Pool.from_bytes``).
Follows spec.transfers / spec.disk:

  spill   the block's bytes are copied (under the lock, a memory copy) and handed to the tier,
          whose workers write, fsync and rename them; the block itself is free at once (the
          copy is the spill's source).  A failed spill just loses the copy, and the object
          is not offered again until the tier's epoch changes (bytes freed, a write
          published, the capacity changed): a full disk costs one failed write per object.
  load    a FREE block of the copy's own kind goes FREE -> LOADING (memory load_start); the
          tier verifies header and checksum (spec can_load_ok) and copies the bytes into the
          load's staging buffer; finishing (under the lock) writes them into the block and
          fires load_ok with the content fixed when the load started (an indexer copy of
          the version it was keyed and verified under), then publishes it.  Anything else ->
          load_bad (FREE): a miss, never an exception.
  version an indexer version bump first drops queued indexer loads and cancels those in
          flight (spec funnel.can_bump_indexer refuses while one is still copying).
  I/O     never under the manager lock: spills and loads run on the tier's workers, probes
          read the tier's in-memory index, ``wait`` and ``refresh`` release the lock.
  transit every spill and load in flight counts against the manager's admission cap (I1).
"""
import collections
import time
from typing import NamedTuple

import torch

from hybridkv.cache.diskplan import DISK_KIND, DiskRead, Load, decide, disk_key
from hybridkv.cache.pool import REC, ObjRef
from hybridkv.disk.entry import DiskAdmissionRefused
from hybridkv.disk.format import DiskError, DiskMeta, abi_id
from hybridkv.errors import AdmissionRefused, BadArgument, InvariantViolation
from spec.common import LOADING, READY


class SpillCounts(NamedTuple):
    """What one ``spill_all`` did, in objects."""
    written: int       # spilled by this call (or found already published by another process)
    failed: int        # whose spill this call started and the tier refused or could not write
    not_retried: int   # whose last spill failed with nothing changed since (tier epoch)
    left: int          # not tried or still in flight at the deadline (budget, admission)


class DiskLink:
    def __init__(self, mgr, tier, spill_kinds=tuple(DISK_KIND), spill_on_evict=True):
        for k in spill_kinds:
            if k not in DISK_KIND:
                raise BadArgument("spill_kinds names an unknown kind", k)
        self.mgr, self.tier = mgr, tier
        self.spill_kinds, self.spill_on_evict = frozenset(spill_kinds), spill_on_evict
        self.loads = {}                  # disk key -> Load (block LOADING, in transit)
        self.pending = collections.OrderedDict()   # disk key -> (DiskRead, keys): queued
        self.spills = {}                 # disk key -> SpillHandle in flight
        self.spill_epoch = {}            # disk key -> tier epoch its spill in flight began at
        self.failed, self.failed_epoch = set(), -1   # disk keys whose spill failed at that
        #                                  tier epoch: not offered again while it is current
        self.known, self._listed, self.refresh_s = set(tier.keys()), time.monotonic(), 1.0
        self.counts = collections.Counter()

    # -- what an object is -------------------------------------------------------------------
    def content(self, kind, group, at):
        """The spec record content an object of (kind, group) covering ``at`` holds now."""
        cx = self.mgr.ctx[group]
        rec = REC[kind]()
        rec = rec._replace(**rec.partial_at(at, cx))
        rec = rec._replace(**rec.completed(cx))
        return tuple(getattr(rec, f) for f in rec.CONTENT)

    def key_for(self, kind, group, ikey, exact):
        """Disk key of an object; an indexer copy is also keyed by the indexer version."""
        return disk_key(ikey, group, exact, f"idx@{self.mgr.miv}" if kind == "idx" else kind)

    def meta(self, kind, group, content):
        pool = self.mgr.pools[(kind, group)]
        desc = (tuple(pool.abi), pool.staged_nbytes)
        if kind == "idx":
            desc += (content[2],)
        return DiskMeta(DISK_KIND[kind], abi_id(desc), content[1], content[0])

    def in_transit(self):
        return len(self.loads) + len(self.spills)

    # -- lookup side (no I/O) ----------------------------------------------------------------
    def probe(self, kind, group, ikey, exact, at, H):
        """DiskRead when object (kind, group, ikey) has a copy on disk or loading."""
        key = self.key_for(kind, group, ikey, exact)
        ld = self.loads.get(key)
        if ld is not None:
            return DiskRead(H, group, kind, at, exact, ikey, "loading", ld.staging.numel())
        try:
            p = self.tier.probe(key)
        except (DiskError, OSError):
            return None
        if p.state not in ("on_disk", "verified"):
            return None
        return DiskRead(H, group, kind, at, exact, ikey, p.state, p.nbytes)

    def candidates(self, keys, limit):
        """Granule numbers i <= limit without a checkpoint record whose first group's exact
        object is in memory or known on disk (part of the checkpoint was spilled, or all of
        it by an earlier process)."""
        if not self.known and not self.loads:
            return frozenset()
        g0 = self.mgr.layout.groups[0]
        kind = next(k for k in ("swa", "tail", "idx", "comp") if k in g0.kinds)
        index = self.mgr.index
        return frozenset(i for i in range(1, limit + 1)
                         if not index.has_checkpoint(keys[i - 1]) and (
            index.exact_block(kind, g0.name, keys[i - 1]) is not None or
            self.key_for(kind, g0.name, keys[i - 1], True) in self.known))

    def _left(self, r):
        ld = self.loads.get(self.key_for(r.kind, r.group, r.ikey, r.exact))
        return r.nbytes if ld is None else max(0, ld.staging.numel() - ld.handle.progress)

    def decide(self, reads, start, H):
        return decide(self.tier.cost_model, reads, start, H, self._left)

    # -- spills --------------------------------------------------------------------------------
    def worth_keeping(self, ref):
        rec = self.mgr.pools[(ref.kind, ref.group)].recs[ref.block]
        return ref.kind in self.spill_kinds and rec.st == READY and \
            self.mgr.index.published(*ref)

    def spill(self, ref):
        """Hand a copy of one READY published block to the tier; returns what happened:
        started | skipped (not worth keeping, or no admission) | stale (an indexer of an old
        version) | deferred (the tier's budget is full) | failed | not_retried (it failed
        before at the tier's current epoch) | present (on disk or in flight)."""
        mgr = self.mgr
        pool = mgr.pools[(ref.kind, ref.group)]
        rec = pool.recs[ref.block]
        if not self.worth_keeping(ref) or not mgr.admission.admits(1):
            self.counts["spill_skipped"] += 1
            return "skipped"
        content = tuple(getattr(rec, f) for f in rec.CONTENT)
        if content != self.content(ref.kind, ref.group, content[0]):
            self.counts["spill_skipped"] += 1          # e.g. an indexer of an old version
            return "stale"
        ikey, exact = mgr.index.key_of(*ref)
        key = self.key_for(ref.kind, ref.group, ikey, exact)
        if key in self.spills or key in self.known:
            return "present"
        if self.gave_up(key):
            self.counts["spill_not_retried"] += 1
            return "not_retried"
        try:
            h = self.tier.spill_async(key, pool.to_bytes(ref.block),      # a fresh copy,
                                      self.meta(ref.kind, ref.group, content), donate=True)
        except DiskAdmissionRefused:
            self.counts["spill_deferred"] += 1
            return "deferred"
        except (DiskError, OSError):
            self.counts["spill_failed"] += 1
            self._note_failed(key, self.tier.epoch)
            return "failed"
        self.spills[key] = h
        self.spill_epoch[key] = self.tier.epoch       # after its own evictions, if any
        self.counts["spill_started"] += 1
        return "started"

    def gave_up(self, key):
        """True while the last spill of ``key`` failed and the tier has not changed since."""
        return self.failed_epoch == self.tier.epoch and key in self.failed

    def _note_failed(self, key, epoch):
        if epoch != self.tier.epoch:
            return                                     # something changed meanwhile: retry
        if epoch != self.failed_epoch:
            self.failed, self.failed_epoch = set(), epoch
        self.failed.add(key)

    def on_evict(self, ref):
        if self.spill_on_evict:
            self.spill(ref)

    def _reap_spills(self):
        for key, h in list(self.spills.items()):
            if h.done():
                del self.spills[key]
                epoch = self.spill_epoch.pop(key)
                ok = h.result(0).ok
                self.counts["spilled" if ok else "spill_failed"] += 1
                if ok:
                    self.known.add(key)
                else:
                    self._note_failed(key, epoch)

    def spill_all(self, timeout):
        """Spill every READY published block (memory copies stay), as fast as the tier's
        budget takes them, waiting without the lock.  Each object is tried at most once per
        call, and not at all while its last spill failed at the tier's current epoch, so a
        full disk returns after one failed write per object.  Returns SpillCounts."""
        deadline = time.monotonic() + timeout
        started, failed, not_retried, stale = {}, set(), set(), set()   # key -> SpillHandle
        while True:
            with self.mgr.lock:
                self._reap_spills()
                for ref in self._unspilled():
                    key = self._spill_key(ref)
                    if key in started or key in failed or key in stale:
                        continue
                    if self.gave_up(key):
                        not_retried.add(key)
                        continue
                    if self.tier.in_flight >= self.tier.cap:
                        break
                    outcome = self.spill(ref)
                    if outcome == "started":
                        started[key] = self.spills[key]
                    elif outcome in ("failed", "stale"):
                        (failed if outcome == "failed" else stale).add(key)
                busy = list(self.spills.values())
            if not busy or time.monotonic() >= deadline:
                break
            busy[0].result(min(0.05, max(0.0, deadline - time.monotonic())))
        with self.mgr.lock:
            self._reap_spills()
            results = [h.result(0) for h in started.values() if h.done()]
            failed |= {r.key for r in results if not r.ok}
            done = failed | not_retried | stale
            left = sum(self._spill_key(ref) not in done for ref in self._unspilled())
        return SpillCounts(sum(r.ok for r in results), len(failed), len(not_retried - failed),
                           left)

    def _unspilled(self):
        """READY published blocks of the spilled kinds without a copy known on disk."""
        return [ObjRef(kind, g, b) for (kind, g), pool in self.mgr.pools.items()
                if kind in self.spill_kinds for b, rec in enumerate(pool.recs)
                if rec.st == READY and self.mgr.index.published(kind, g, b)
                and self._spill_key(ObjRef(kind, g, b)) not in self.known]

    def _spill_key(self, ref):
        key = self.mgr.index.key_of(*ref)
        return None if key is None else self.key_for(ref.kind, ref.group, key[0], key[1])

    # -- loads ---------------------------------------------------------------------------------
    def start(self, plan):
        """Queue verified loads for ``plan.disk`` (re-keyed from each object's index key: a
        plan naming foreign disk keys loads nothing foreign) and start what the cap allows;
        returns how many were accepted.  A malformed read raises BadArgument, queueing none."""
        mgr, reads = self.mgr, tuple(plan.disk)
        for r in reads:
            if not isinstance(r, DiskRead) or (r.kind, r.group) not in mgr.pools or \
                    not isinstance(r.ikey, bytes) or not isinstance(r.at, int) or r.at < 1:
                raise BadArgument("prefetch: not a disk read of this cache", r)
        keys = plan.chain_keys
        n = 0
        for r in reads:
            key = self.key_for(r.kind, r.group, r.ikey, r.exact)
            published = (mgr.index.exact_block if r.exact else mgr.index.chain_block)(
                r.kind, r.group, r.ikey)
            if key in self.loads or key in self.pending or published is not None:
                continue
            self.pending[key] = (r, keys)
            n += 1
        self._pump(protect=plan.reads)
        return n

    def _pump(self, protect=()):
        mgr = self.mgr
        for key in list(self.pending):
            if self.tier.in_flight >= self.tier.cap or not mgr.admission.admits(1):
                return                                  # budget full: stays queued
            r, keys = self.pending.pop(key)
            if self.tier.state(key) in ("on_disk", "verified"):
                self._start_one(key, r, keys, protect)

    def _start_one(self, key, r, keys, protect):
        mgr, pk = self.mgr, (r.kind, r.group)
        pool = mgr.pools[pk]
        try:
            with mgr.evictor.holding(protect):
                mgr.admission.check({pk: 1})
                mgr.admission.make_room({pk: 1})
        except AdmissionRefused:
            return False
        b = pool.alloc()
        pool.fire(b, "load_start")                      # preallocated: address fixed
        content = self.content(r.kind, r.group, r.at)
        staging = torch.empty(pool.staged_nbytes, dtype=torch.uint8)
        valid = lambda p=pool, b=b: p.recs.state(b) == LOADING      # noqa: E731
        try:
            h = self.tier.load_async(key, staging, self.meta(r.kind, r.group, content), valid)
        except (DiskError, OSError):
            pool.fire(b, "load_bad")
            return False
        self.loads[key] = Load(ObjRef(r.kind, r.group, b), r, key, h, staging, content, keys)
        self.counts["loads_started"] += 1
        return True

    def reap(self):
        """Finish what is done (under the lock): loads publish or free their blocks, spills
        become known; then start queued loads."""
        self._reap_spills()
        for key, ld in list(self.loads.items()):
            if ld.handle.done():
                self._finish(key, ld, ld.handle.result(0))
        self._pump()

    def wait(self, timeout):
        """Reap until nothing is in flight or queued, or ``timeout`` s passed; waits never
        hold the manager lock.  Returns how many loads are still in flight or queued."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not 0 <= timeout < float("inf"):
            raise BadArgument("timeout must be a finite number of seconds >= 0", timeout)
        deadline = time.monotonic() + timeout
        self.refresh()
        while True:
            with self.mgr.lock:
                self.reap()
                busy = [ld.handle for ld in self.loads.values()] + list(self.spills.values())
                left = len(self.loads) + len(self.pending)
            remaining = deadline - time.monotonic()
            if not busy or remaining <= 0:
                return left
            busy[0].result(min(remaining, 0.05))

    def refresh(self):
        """Adopt what other processes spilled (blocking, off the lock, at most every
        ``refresh_s``) and renew the set of keys known on disk."""
        if time.monotonic() - self._listed > self.refresh_s:
            self._listed = time.monotonic()
            self.tier.refresh()
            self.known = set(self.tier.keys())

    def _finish(self, key, ld, res):
        mgr = self.mgr
        del self.loads[key]
        r, pool = ld.read, mgr.pools[(ld.ref.kind, ld.ref.group)]
        taken = (mgr.index.exact_block if r.exact else mgr.index.chain_block)(
            r.kind, r.group, r.ikey) is not None
        if not res.ok or taken or ld.content != self.content(r.kind, r.group, r.at):
            pool.fire(ld.ref.block, "load_bad")
            self.counts["load_redundant" if res.ok else "load_miss" if res.status == "miss"
                        else "load_cancelled"] += 1
            return
        pool.from_bytes(ld.ref.block, ld.staging)
        pool.fire(ld.ref.block, "load_ok", ld.content)
        self._publish(ld)
        self.counts["load_verified"] += 1

    def _publish(self, ld):
        """A verified copy joins the index as a computed block would (PrefixIndex.parent_for,
        anchors_at: the writer's rules); the last exact object of a checkpoint loaded
        records it."""
        mgr, r = self.mgr, ld.read
        parent = mgr.index.parent_for(r.kind, r.group, ld.keys, r.at, r.exact)
        if mgr.index.publish(ld.ref, r.ikey, r.exact, parent):
            mgr.evictor.entered(ld.ref)
        mgr.evictor.admit(ld.ref, r.at, r.exact)
        if r.exact and all(mgr.index.exact_block(s.kind, s.group, r.ikey) is not None
                           for s in mgr.layout.exact_at(r.H)):
            anchors = mgr.index.anchors_at(ld.keys, r.H)
            if anchors is not None:
                mgr.index.add_checkpoint(r.H, r.ikey, anchors)

    def cancel(self):
        """Drop queued loads and cancel those in flight; returns how many still finish."""
        self.pending.clear()
        for key, ld in list(self.loads.items()):
            if ld.handle.cancel():
                del self.loads[key]
                self.mgr.pools[(ld.ref.kind, ld.ref.group)].fire(ld.ref.block, "load_bad")
                self.counts["load_cancelled"] += 1
        self.reap()
        return len(self.loads)

    def quiesce_indexer(self):
        """Before an indexer version bump: queued indexer loads are dropped, those in flight
        cancelled (finished ones reaped); returns how many are still copying."""
        for key in [k for k, (r, _) in self.pending.items() if r.kind == "idx"]:
            del self.pending[key]
        self.reap()
        for key, ld in list(self.loads.items()):
            if ld.read.kind == "idx" and ld.handle.cancel():
                del self.loads[key]
                self.mgr.pools[(ld.ref.kind, ld.ref.group)].fire(ld.ref.block, "load_bad")
                self.counts["load_cancelled"] += 1
        return sum(ld.read.kind == "idx" for ld in self.loads.values())

    # -- accounting --------------------------------------------------------------------------
    def loading_blocks(self):
        return [ld.ref for ld in self.loads.values()]

    def stats(self):
        return dict(self.counts, loads_in_flight=len(self.loads), loads_queued=len(self.pending),
                    spills_in_flight=len(self.spills), used_bytes=self.tier.used_bytes,
                    entries=len(self.tier.keys()))

    def check(self):
        """I2 for loads: every LOADING block has exactly one load of its own kind and group;
        every load targets a LOADING block."""
        targets = collections.Counter(ld.ref for ld in self.loads.values())
        for key, ld in self.loads.items():
            if self.mgr.pools[(ld.ref.kind, ld.ref.group)].recs.state(ld.ref.block) != LOADING:
                raise InvariantViolation("load_target", (key, ld.ref))
        for (kind, g), pool in self.mgr.pools.items():
            for b, rec in enumerate(pool.recs):
                n = targets.get(ObjRef(kind, g, b), 0)
                if (rec.st == LOADING) != (n == 1) or n > 1:
                    raise InvariantViolation("state_routing_loads", ((kind, g, b), n))

