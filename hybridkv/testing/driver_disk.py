"""ObjectDriver's disk actions: DiskRec records fired through the DiskPrefixMachine table
(spec guards: can_load_ok / can_load_bad), coupled to the memory object they copy.  The
cross-object conditions are the spec's own system guards: ``can_disk_target`` (the finishing
event names the kind the record targets) on the driver's disk records, ``can_load_start``
conjunct by conjunct through LOAD_START_CHECKS (its admission conjunct is the runtime's
own rule, CacheManager.admission.admits)."""
from types import SimpleNamespace

from hybridkv.cache.tables import table_for
from spec import common
from spec.disk import DiskPrefixMachine, DiskRec
from spec.state import KINDS
from spec.system import can_disk_target

IDX = KINDS.index("idx")

_DISK = table_for(DiskPrefixMachine)
# spec.system.can_load_start: I2 (copy loads into its own kind), I1 (the runtime's admission)
LOAD_START_CHECKS = {"kind": lambda d, dd, k: d.state.disk[dd].kind == k,
                     "admit": lambda d, dd, k: d.admits(),
                     "version": lambda d, dd, k: d.state.disk[dd].kind != IDX
                     or d.state.disk[dd].x == d.mgr.miv}
BLANK = {f: 0 for f in DiskRec._fields if f != "st"}     # a freed slot forgets its copy


def _disk_can(self, d, event):
    rec = self.state.disk[d]
    self._need(_DISK.target(rec.st, event, rec, self.mgr.ctx[self.group]) is not None,
               ("disk", d, event))


def _disk_fire(self, d, event, **fields):
    rec = self.state.disk[d]
    st = _DISK.fire(rec.st, event, rec, self.mgr.ctx[self.group])
    self.state.disk[d] = rec._replace(st=st, **fields)


def spill_start(self, d, k, i):
    o = self.pools[k].recs[i]
    self._need(self.admits(), "admission")
    _disk_can(self, d, "spill_start")
    self._can(k, i, "pin")
    a, b, x = common.content(o)
    _disk_fire(self, d, "spill_start", kind=k, a=a, b=b, x=x, ver=o.ver, hdr=1, ck=1,
               abi=self.cfg.kabi, off=0, ln=0, tk=k, obj=i)
    self.pools[k].fire(i, "pin")


def _finish(event, mem_event, payload=False, **disk_fields):
    def act(self, d, k):
        rec = self.state.disk[d]
        self._need(can_disk_target(SimpleNamespace(disk=self.state.disk), self.cfg, d, k),
                   ("disk target", d, k))
        _disk_can(self, d, event)
        self._can(k, rec.obj, mem_event)
        args = ((rec.a, rec.b, rec.x)[:len(self.pools[k].recs[0].CONTENT)],) if payload else ()
        _disk_fire(self, d, event, **disk_fields)
        self.pools[k].fire(rec.obj, mem_event, *args)
    act.__name__ = event
    return act


spill_done = _finish("spill_done", "unpin")
spill_crash = _finish("spill_crash", "unpin", **BLANK)
load_ok = _finish("load_ok", "load_ok", payload=True)
load_bad = _finish("load_bad", "load_bad")
load_cancel = _finish("load_cancel", "load_bad")


def damage(self, d, f):
    r, c = self.state.disk[d], self.cfg
    fields = ({"ck": 0, "b": 0}, {"hdr": 0, "a": c.max_pos - r.a},
              {"abi": c.kabi + 1, "b": 0}, {"off": 1, "b": 0}, {"ln": 1, "b": 0})[f]
    _disk_can(self, d, "damage")
    _disk_fire(self, d, "damage", **fields)


def load_start(self, d, k, i):
    self._checks(LOAD_START_CHECKS, d, k)           # spec can_load_start, conjunct by conjunct
    _disk_can(self, d, "load_start")
    self._can(k, i, "load_start")
    _disk_fire(self, d, "load_start", tk=k, obj=i)
    self.pools[k].fire(i, "load_start")


def drop(self, d):
    _disk_can(self, d, "drop")
    _disk_fire(self, d, "drop", **BLANK)
