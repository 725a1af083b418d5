"""Disk actions: spill (pinned source, fsync + rename), faults, verified loads."""
from spec import common
from spec.disk import DiskRec
from spec.dual import And, Select

from spec.system import (D, FAULTS, K, O, _disk, _mem, action, can_admit, can_disk_target,
                         can_load_start)


@action(D, K, O)
def spill_start(s, c, d, k, i):
    o = Select(s.mem[k], i)
    a, b, x = common.content(o)
    en_d, s2 = _disk(s, c, d, "spill_start", kind=k, a=a, b=b, x=x, ver=o.ver, hdr=1, ck=1,
                     abi=c.kabi, off=0, ln=0, tk=k, obj=i)
    en_m, s3 = _mem(s2, c, k, i, "pin")
    return And(en_d, en_m, can_admit(s, c)), s3


_BLANK = {f: 0 for f in DiskRec._fields if f != "st"}   # a freed slot forgets its copy


def _no_args(rec, n):
    return ()


def _payload(rec, n):
    return ((rec.a, rec.b, rec.x)[:n],)


def _finish(event, mem_event, args_of=_no_args, **disk_fields):
    def act(s, c, d, k):
        rec = Select(s.disk, d)
        en_d, s2 = _disk(s, c, d, event, **disk_fields)
        args = args_of(rec, len(s.mem[k][0].CONTENT))
        en_m, s3 = _mem(s2, c, k, rec.obj, mem_event, *args)
        return And(can_disk_target(s, c, d, k), en_d, en_m), s3
    act.__name__ = event
    return action(D, K)(act)


spill_done = _finish("spill_done", "unpin")
spill_crash = _finish("spill_crash", "unpin", **_BLANK)
load_ok = _finish("load_ok", "load_ok", _payload)
load_bad = _finish("load_bad", "load_bad")
load_cancel = _finish("load_cancel", "load_bad")


@action(D, FAULTS)
def damage(s, c, d, f):
    """Faults on a file at rest: payload bit flip, header bit flip, a foreign build's ABI,
    a misaligned payload offset, a torn write (renamed before the payload's last page landed:
    the file is short).  Each also garbles what a careless reader would get."""
    r = Select(s.disk, d)
    fields = ({"ck": 0, "b": 0}, {"hdr": 0, "a": c.max_pos - r.a},
              {"abi": c.kabi + 1, "b": 0}, {"off": 1, "b": 0}, {"ln": 1, "b": 0})[f]
    return _disk(s, c, d, "damage", **fields)


@action(D, K, O)
def load_start(s, c, d, k, i):
    en_d, s2 = _disk(s, c, d, "load_start", tk=k, obj=i)
    en_m, s3 = _mem(s2, c, k, i, "load_start")
    return And(can_load_start(s, c, d, k), en_d, en_m), s3


@action(D)
def drop(s, c, d):
    return _disk(s, c, d, "drop", **_BLANK)


