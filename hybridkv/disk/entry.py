"""Disk-tier entries, results and named errors."""
from dataclasses import dataclass, field
import time
from typing import NamedTuple

from hybridkv.disk.format import DiskError
from hybridkv.disk.loader import LoadHandle, disk_rec
from spec.disk import DiskPrefixMachine as M

FREE, WRITING, ON_DISK, LOADING, VERIFIED, CORRUPT = (
    M.free.value, M.writing.value, M.on_disk.value, M.loading.value, M.verified.value,
    M.corrupt.value)
STATE_NAMES = {s.value: s.id for s in M.states}


class DiskAdmissionRefused(DiskError):
    """Objects in flight (loading + writing) already at the cap; nothing was changed."""

    def __init__(self, in_flight, cap):
        super().__init__(f"disk tier admission refused: {in_flight} in flight, cap {cap}")
        self.in_flight, self.cap = in_flight, cap


class IllegalTransition(DiskError):
    def __init__(self, event, state):
        super().__init__(f"{event} not enabled in state {STATE_NAMES.get(state, state)}")
        self.event, self.state = event, state


class SpillResult(NamedTuple):
    key: str
    ok: bool
    reason: str
    nbytes: int = 0
    seconds: float = 0.0


class DiskProbe(NamedTuple):
    key: str
    state: str            # "absent" or a DiskPrefixMachine state id
    nbytes: int
    decision: object      # costmodel.CostDecision, or None without a cost model


@dataclass
class Entry:
    key: str
    st: int
    nbytes: int
    hdr: object = None
    handle: LoadHandle = None
    t: float = field(default_factory=time.monotonic)


def rec(hdr_ok=1, ck_ok=1, abi=0, off=0, st=0):
    return disk_rec(st=st, hdr=hdr_ok, ck=ck_ok, abi=abi, off=off)
