"""The disk tier's index: entries in least-recently-used order, bytes used, objects in
flight and names whose blob is being deleted.  Every entry state change goes through the
spec's compiled table here (spec.disk.DiskPrefixMachine via spec.table.fire).

Callers hold ``lock`` around every method; no method does backend I/O.  Deletions are
decided here (a key moves to ``removing``) and done by the caller after releasing the lock;
a key in ``removing`` can be neither spilled nor adopted until ``released``."""
import collections
import threading

from hybridkv.disk.entry import (CORRUPT, FREE, LOADING, ON_DISK, VERIFIED, WRITING,
                                 DiskAdmissionRefused, Entry, IllegalTransition, rec)
from hybridkv.disk.loader import DiskCtx
from spec.disk import DiskPrefixMachine as M
from spec.table import fire

IDLE = (ON_DISK, VERIFIED, CORRUPT)


class TierIndex:
    def __init__(self, capacity, cap):
        self.lock = threading.RLock()
        self.capacity = capacity              # bytes the indexed blobs may take
        self.cap = cap                        # objects in flight (writing + loading) at most
        self.entries = collections.OrderedDict()   # key -> Entry, least recently used first
        self.used = 0                         # bytes of every indexed entry, writing included
        self.in_flight = 0                    # entries in writing or loading
        self.removing = set()                 # keys whose blob the tier is deleting
        self.epoch = 0                        # bumped when a failed write might now succeed

    def go(self, e, event, record=None, kabi=0):
        """Fire one spec transition on ``e``; IllegalTransition when it is not enabled."""
        ok, tgt = fire(M, event, e.st, record or rec(st=e.st), DiskCtx(kabi))
        if not ok:
            raise IllegalTransition(event, e.st)
        self.in_flight += (tgt in (WRITING, LOADING)) - (e.st in (WRITING, LOADING))
        e.st = tgt

    def get(self, key):
        return self.entries.get(key)

    def admit(self):
        """Raise DiskAdmissionRefused (changing nothing) when the in-flight budget is full."""
        if self.in_flight >= self.cap:
            raise DiskAdmissionRefused(self.in_flight, self.cap)

    def reserve(self, key, size):
        """A new writing entry of ``size`` bytes and the keys evicted to make room (now in
        ``removing``), or (None, []) when it cannot fit."""
        evicted = self.make_room(size) if size <= self.capacity else None
        if evicted is None:
            return None, []
        e = Entry(key, FREE, size)
        self.go(e, "spill_start")
        self.entries[key] = e
        self.used += size
        return e, evicted

    def abort(self, e):
        """A spill that published nothing: writing -> free, forgotten."""
        self.go(e, "spill_crash")
        self._forget(e)

    def published(self, e, hdr, nbytes):
        """writing -> on_disk with the header of the blob now under its name."""
        self.go(e, "spill_done", rec(1, 1, hdr.abi, hdr.payload_off, e.st))
        self.used += nbytes - e.nbytes
        e.nbytes, e.hdr = nbytes, hdr
        self.epoch += 1                       # the backend takes writes again

    def adopt(self, e):
        """Index an on_disk entry found on the backend; False when the key is known or
        being deleted."""
        if e.key in self.entries or e.key in self.removing:
            return False
        self.entries[e.key] = e
        self.used += e.nbytes
        return True

    def touch(self, key):
        self.entries.move_to_end(key)

    def drop(self, e, delete):
        """Forget an idle entry (on_disk / verified / corrupt -> free); with ``delete`` the
        caller must delete its blob and then call ``released``."""
        self.go(e, "drop")
        self._forget(e)
        self.epoch += 1                       # bytes freed
        if delete:
            self.removing.add(e.key)

    def released(self, keys):
        self.removing.difference_update(keys)

    def make_room(self, need):
        """Drop least recently used idle entries until ``need`` more bytes fit; returns the
        dropped keys (to delete), or None -- changing nothing -- when they cannot fit."""
        idle = [e for e in self.entries.values() if e.st in IDLE]
        if self.used + need - sum(e.nbytes for e in idle) > self.capacity:
            return None
        evicted = []
        for e in idle:
            if self.used + need <= self.capacity:
                break
            self.drop(e, delete=True)
            evicted.append(e.key)
        return evicted

    def _forget(self, e):
        del self.entries[e.key]
        self.used -= e.nbytes
