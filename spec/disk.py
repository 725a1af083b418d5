"""On-disk prefix: a spilled copy of one memory object.

Final only after write + fsync + rename; readable only after its header (magic, format,
ABI) and payload checksum verify on load.  "File exists" is never a hit.
"""
from typing import NamedTuple

from statemachine import State, StateMachine

from spec.dual import And, Not
from spec.funnel import DISK_ALIGN, can_hit_abi, can_hit_bytes


class DiskRec(NamedTuple):
    st: int      # DiskPrefixMachine state value
    kind: int    # kind of the object whose copy this is
    a: int       # payload: the source object's content fields
    b: int
    x: int
    ver: int     # source object's version when spilled
    hdr: int     # 1 while the header bytes are intact
    ck: int      # 1 while the payload matches its checksum
    abi: int     # ABI id written in the header
    off: int     # payload offset in the file (must be DISK_ALIGN-aligned)
    ln: int      # payload length in bytes (whole DISK_ALIGN pages; a torn write leaves it short)
    tk: int      # kind of the memory object being spilled from or loaded into
    obj: int     # index of that memory object


def can_load_ok(o, c):
    """Header intact, ABI ours (funnel layer 2), payload offset and length whole pages for
    DMA (funnel layer 4), checksum matches."""
    return And(o.hdr == 1, can_hit_abi((o.abi,), (c.kabi,)),
               can_hit_bytes(o.off, o.ln, DISK_ALIGN), o.ck == 1)


def can_load_bad(o, c):
    return Not(can_load_ok(o, c))


class DiskPrefixMachine(StateMachine):
    """On-disk prefix: free -> writing -> on_disk -> loading -> verified | corrupt."""

    free = State(initial=True, value=0)
    writing = State(value=1)
    on_disk = State(value=2)
    loading = State(value=3)
    verified = State(value=4)
    corrupt = State(value=5)

    spill_start = free.to(writing)
    spill_done = writing.to(on_disk)
    spill_crash = writing.to(free)
    damage = on_disk.to.itself()
    load_start = on_disk.to(loading) | verified.to(loading)
    load_ok = loading.to(verified, cond=can_load_ok)
    load_bad = loading.to(corrupt, cond=can_load_bad)
    load_cancel = loading.to(on_disk)
    drop = on_disk.to(free) | verified.to(free) | corrupt.to(free)
