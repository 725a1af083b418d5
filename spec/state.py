"""The abstract whole-system state: a few objects of each kind, requests, graphs."""
from typing import NamedTuple

from spec import compressed, indexer, swa, tail
from spec.common import WRITING
from spec.config import Ctx
from spec.disk import DiskPrefixMachine, DiskRec
from spec.dual import And, Count, Or, Select

KIND_MODULES = (compressed, tail, swa, indexer)
KINDS = ("comp", "tail", "swa", "idx")
RECS = (compressed.CompRec, tail.TailRec, swa.SwaRec, indexer.IdxRec)
MACHINES = (compressed.CompressedKVMachine, tail.UncompressedTailMachine,
            swa.SwaWindowMachine, indexer.IndexerMachine)
DISK = DiskPrefixMachine
D_FREE, D_WRITING, D_ON_DISK, D_LOADING, D_VERIFIED, D_CORRUPT = range(6)
IDLE, LOOKED, HELD, RUNNING = range(4)   # request phases


class Req(NamedTuple):
    ph: int        # IDLE -> LOOKED (funnel passed) -> HELD (pinned) -> RUNNING (launched)
    H: int         # resume point chosen by lookup
    ref: tuple     # per kind: index of the object it resumes from
    pv: tuple      # per kind: version seen at lookup
    pe: tuple      # per kind: relocation epoch seen at lookup


class Graph(NamedTuple):
    cap: int       # 1 while captured
    ref: tuple     # per kind: object whose address the graph baked in
    eps: tuple     # per kind: epoch of that address at capture
    bad: int       # history: 1 once a capture baked in an address its request had not pinned
                   # and validated, or a replay read a moved or never-captured address


class Sys(NamedTuple):
    mem: tuple     # per kind: tuple of records
    disk: tuple
    req: tuple
    graph: tuple
    miv: int       # the model's indexer version


def initial(c):
    zeros = (0,) * len(KINDS)
    return Sys(mem=tuple(tuple(R() for _ in range(c.n_obj)) for R in RECS),
               disk=tuple(DiskRec(*(0,) * len(DiskRec._fields)) for _ in range(c.n_disk)),
               req=tuple(Req(IDLE, 0, zeros, zeros, zeros) for _ in range(c.n_req)),
               graph=tuple(Graph(0, zeros, zeros, 0) for _ in range(c.n_graph)),
               miv=0)


def ctx(s, c):
    return Ctx(c, s.miv)


def refs_of(s, ref):
    """The records a per-kind index tuple points at."""
    return tuple(Select(s.mem[k], ref[k]) for k in range(len(KINDS)))


def inflight(s):
    """Objects in transit: being written (drafts included), spilled or loaded."""
    return (Count(o.st == WRITING for objs in s.mem for o in objs)
            + Count(Or(d.st == D_WRITING, d.st == D_LOADING) for d in s.disk))


def holders(s, k, i):
    """Who holds a pin on object i of kind k: active requests and disk spills."""
    return (Count(And(Or(r.ph == HELD, r.ph == RUNNING), r.ref[k] == i) for r in s.req)
            + Count(And(d.st == D_WRITING, d.tk == k, d.obj == i) for d in s.disk))


def loaders(s, k, i):
    return Count(And(d.st == D_LOADING, d.tk == k, d.obj == i) for d in s.disk)
