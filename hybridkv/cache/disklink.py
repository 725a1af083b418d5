"""The manager's link to a DiskTier: spill on eviction, verified loads into preallocated
blocks, and the disk side of a lookup.  Follows spec.transfers / spec.disk:

  spill   the source block is pinned (READY -> PINNED) while the tier writes, fsyncs and
          renames; then unpinned, and only then evicted.  A failed spill just loses the copy.
  load    a FREE block of the copy's own kind goes FREE -> LOADING (memory load_start); the
          tier copies bytes into it only after header + checksum verify (spec can_load_ok);
          reaped under the manager lock: VERIFIED -> memory load_ok with the content the
          header describes, published under its index key; anything else -> load_bad (FREE),
          the disk entry is already invalidated by the tier: a miss, never an exception.
  transit every load in flight counts against the manager's admission cap (I1).

Disk keys are blake2b(index object key, kind): the index key already carries the tenant
salt, layout id and model version (hybridkv.index), so they key the disk tier too.  The
header's ABI id is the pool's AbiDesc (plus the indexer version for indexer objects);
tok_hi is the position the object covers, tok_lo its second content field.
"""
import collections
import time

from hybridkv import alloc as A
from hybridkv.diskplan import DISK_KIND, Load, disk_key
from hybridkv.disk.format import DiskError, DiskMeta, abi_id, key_of
from hybridkv.errors import AdmissionRefused, InvariantViolation
from hybridkv.pools import REC, ObjRef
from spec.common import LOADING, READY

class DiskLink:
    def __init__(self, mgr, tier, spill_kinds=tuple(DISK_KIND), spill_on_evict=True):
        self.mgr, self.tier = mgr, tier
        self.spill_kinds, self.spill_on_evict = frozenset(spill_kinds), spill_on_evict
        self.loads = {}                  # disk key -> Load (block LOADING, counted in transit)
        self.pending = collections.OrderedDict()   # disk key -> queued load (holds nothing)
        self.known, self._listed, self.refresh_s = set(), -1e9, 1.0
        self.spilling = 0
        self.counts = {"spilled": 0, "spill_failed": 0, "spill_skipped": 0, "loads_started": 0,
                       "load_verified": 0, "load_miss": 0, "load_cancelled": 0,
                       "load_redundant": 0}

    # -- what an object is -------------------------------------------------------------------
    def expected(self, kind, group, at):
        """The spec record content an object of (kind, group) covering ``at`` holds."""
        cx = self.mgr.ctx[group]
        rec = REC[kind]()
        rec = rec._replace(**rec.partial_at(at, cx))
        rec = rec._replace(**rec.completed(cx))
        return tuple(getattr(rec, f) for f in rec.CONTENT)

    def key_for(self, ikey, kind):
        """Disk key of the object published under ``ikey``; an indexer copy is also keyed
        by the indexer version (a copy of old weights is another object)."""
        return disk_key(ikey, f"{kind}@{self.mgr.miv}" if kind == "idx" else kind)

    def meta(self, kind, group, at):
        pool = self.mgr.pools[(kind, group)]
        c = self.expected(kind, group, at)
        abi = abi_id((tuple(pool.abi), self.mgr.miv) if kind == "idx" else tuple(pool.abi))
        return DiskMeta(DISK_KIND[kind], abi, c[1], c[0])

    def state(self, key):
        if key in self.loads:
            return "loading"
        try:
            return self.tier.state(key)
        except (DiskError, OSError):
            return "absent"

    # -- spill ---------------------------------------------------------------------------------
    def worth_keeping(self, ref, rec):
        return ref.kind in self.spill_kinds and rec.st == READY and \
            self.mgr.index.published(ref.kind, ref.group, ref.block)

    def spill(self, ref):
        """Copy one READY published block to disk (pinned while written).  True on success;
        never raises for disk trouble."""
        mgr = self.mgr
        pool = mgr.pools[(ref.kind, ref.group)]
        rec = pool.recs[ref.block]
        if not self.worth_keeping(ref, rec) or not A.admits(mgr, 1):
            self.counts["spill_skipped"] += 1
            return False
        at = getattr(rec, rec.CONTENT[0])
        content = tuple(getattr(rec, f) for f in rec.CONTENT)
        if content != self.expected(ref.kind, ref.group, at):
            self.counts["spill_skipped"] += 1          # e.g. an indexer of an old version
            return False
        ikey = mgr.index.key_of[(ref.kind, ref.group)][ref.block]
        pool.fire(ref.block, "pin")
        self.spilling += 1                              # in transit until fsync + rename
        try:
            res = self.tier.spill(self.key_for(ikey, ref.kind), pool.view(ref.block),
                                  self.meta(ref.kind, ref.group, at))
            ok = res.ok
            if ok:
                self.known.add(res.key)
        except (DiskError, OSError):
            ok = False
        finally:
            self.spilling -= 1
            pool.fire(ref.block, "unpin")
        self.counts["spilled" if ok else "spill_failed"] += 1
        return ok

    def on_evict(self, ref):
        if self.spill_on_evict:
            self.spill(ref)

    def spill_all(self):
        """Spill every READY published block (memory copies stay): a checkpoint to disk."""
        n = 0
        for (kind, g), pool in self.mgr.pools.items():
            for b in list(self.mgr.index.key_of[(kind, g)]):
                if pool.recs[b].st == READY:
                    n += self.spill(ObjRef(kind, g, b))
        return n

    # -- loads ---------------------------------------------------------------------------------
    def maybe_on_disk(self, key):
        """Cheap pre-filter for lookup candidates: loading, or named by a file the backend
        listed (re-listed at most every ``refresh_s``); the funnel then asks the tier."""
        if key in self.loads:
            return True
        if time.monotonic() - self._listed > self.refresh_s:
            self._listed = time.monotonic()
            try:
                names = self.tier.backend.names()
            except Exception:                           # a listing fault hides nothing
                names = []
            self.known = {k for k in map(key_of, names) if k} | set(self.tier.keys())
        return key in self.known

    def start(self, reads, ckpt, protect=()):
        """Queue verified loads for ``reads`` (DiskRead) and start as many as the admission
        cap and the tier's in-flight budget allow (the rest start as loads finish, see
        reap); returns how many were accepted."""
        n = 0
        for r in reads:
            if r.key in self.loads or r.key in self.pending or \
                    self.mgr.index.get(r.kind, r.group, r.ikey) is not None:
                continue
            exact = ckpt is not None and r.ikey in {x.key for x in ckpt.needs if x.exact}
            self.pending[r.key] = (r, ckpt if exact else None, tuple(protect))
            n += 1
        self._pump()
        return n

    def _pump(self):
        for key in list(self.pending):
            if self.tier.in_flight >= self.tier.cap or not A.admits(self.mgr, 1):
                return                                  # budget full: stays queued
            r, ckpt, protect = self.pending.pop(key)
            if self.state(r.key) in ("on_disk", "verified"):
                self._start_one(r, ckpt, protect)

    def _start_one(self, r, ckpt, protect):
        mgr, pk = self.mgr, (r.kind, r.group)
        pool = mgr.pools[pk]
        if pool.n_free < 1:
            held = [x for x in protect if x.block in mgr.evictable.get((x.kind, x.group), ())]
            for x in held:                              # the plan's memory part stays
                A.make_ineligible(mgr, x)
            try:
                A.admission(mgr, {pk: 1})
                A.make_room(mgr, pk, 1)
            except AdmissionRefused:
                return False
            finally:
                for x in held:
                    A.make_eligible(mgr, x)
        b = pool.alloc()
        pool.fire(b, "load_start")                      # preallocated: address fixed
        valid = lambda p=pool, b=b: p.recs[b].st == LOADING   # noqa: E731
        try:
            h = self.tier.load_async(r.key, pool.view(b), self.meta(r.kind, r.group, r.at),
                                     valid)
        except (DiskError, OSError):
            pool.fire(b, "load_bad")
            return False
        self.loads[r.key] = Load(ObjRef(r.kind, r.group, b), r.ikey, r.at, h, r.nbytes, ckpt)
        self.counts["loads_started"] += 1
        return True

    def reap(self, wait=None, pump=True):
        """Finish loads that are done (frees or publishes blocks: never takes any), then,
        with ``pump``, start queued ones (takes blocks: never inside an allocation).  With
        ``wait`` seconds: keep waiting until nothing is in flight or queued."""
        deadline = time.monotonic() + (wait or 0)
        while True:
            for key, ld in list(self.loads.items()):
                if ld.handle.done():
                    self._finish(key, ld, ld.handle.result(0))
            if pump:
                self._pump()
            left = deadline - time.monotonic()
            if not wait or left <= 0 or not (self.loads or self.pending):
                return
            if self.loads:
                next(iter(self.loads.values())).handle.result(min(left, 0.05))
            else:
                return                                  # queued but nothing can start

    def _finish(self, key, ld, res):
        mgr = self.mgr
        del self.loads[key]
        pool = mgr.pools[(ld.ref.kind, ld.ref.group)]
        if res.ok and mgr.index.get(ld.ref.kind, ld.ref.group, ld.ikey) is None:
            pool.fire(ld.ref.block, "load_ok", self.expected(ld.ref.kind, ld.ref.group, ld.at))
            mgr.index.put(ld.ref.kind, ld.ref.group, ld.ikey, ld.ref.block)
            A.admit_entry(mgr, ld.ref, ld.at, ld.ckpt is not None)
            A.make_eligible(mgr, ld.ref)
            if ld.ckpt is not None:
                mgr.index.add_checkpoint(ld.ckpt)
            self.counts["load_verified"] += 1
        else:                                           # miss, cancelled, or already there
            pool.fire(ld.ref.block, "load_bad")
            self.counts["load_redundant" if res.ok else "load_miss" if res.status == "miss"
                        else "load_cancelled"] += 1

    def cancel(self):
        """Drop queued loads and cancel those in flight; a block the tier guarantees
        untouched goes back FREE at once."""
        self.pending.clear()
        for key, ld in list(self.loads.items()):
            if ld.handle.cancel():
                del self.loads[key]
                self.mgr.pools[(ld.ref.kind, ld.ref.group)].fire(ld.ref.block, "load_bad")
                self.counts["load_cancelled"] += 1
        self.reap()

    def check(self):
        """I2 for loads: every LOADING block has exactly one load of its own kind and group;
        every load targets a LOADING block."""
        targets = {}
        for key, ld in self.loads.items():
            targets[ld.ref] = targets.get(ld.ref, 0) + 1
            if self.mgr.pools[(ld.ref.kind, ld.ref.group)].recs[ld.ref.block].st != LOADING:
                raise InvariantViolation("load_target", (key, ld.ref))
        for (kind, g), pool in self.mgr.pools.items():
            for b, rec in enumerate(pool.recs):
                n = targets.get(ObjRef(kind, g, b), 0)
                if (rec.st == LOADING) != (n == 1) or n > 1:
                    raise InvariantViolation("state_routing_loads", ((kind, g, b), n))
