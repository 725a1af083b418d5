"""A request's bookkeeping inside the CacheManager, the allocation result, and argument
checks shared by the manager's methods."""
from dataclasses import dataclass, field
from typing import NamedTuple

from hybridkv.errors import BadArgument
from hybridkv.lookup import HitPlan
from spec.state import LOOKED


class Allocation(NamedTuple):
    start: int
    end: int
    draft_end: int
    tables: dict          # (kind, group) -> block ids this request reads or writes, in order


@dataclass(eq=False)
class ReqState:
    rid: object
    salt: bytes
    root: bytes
    tokens: list
    keys: list
    plan: HitPlan
    phase: int = LOOKED
    L: int = 0
    A: int = 0
    D: int = 0
    reads: list = field(default_factory=list)
    own: list = field(default_factory=list)
    drafts: list = field(default_factory=list)
    work: dict = field(default_factory=dict)
    cow: dict = field(default_factory=dict)
    pubd: set = field(default_factory=set)
    points: list = field(default_factory=list)
    recorded: set = field(default_factory=set)
    snaps: dict = field(default_factory=dict)
    snap_count: dict = field(default_factory=dict)
    snap_ver: dict = field(default_factory=dict)     # snapshot ref -> version when sealed
    tags: dict = field(default_factory=dict)
    branch: int = 0


def _count(name, v, minimum=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadArgument(f"{name} must be an int >= {minimum}", v)
