"""Uncompressed tail: the compressor's open window (fp32 kv+gate rows, incl. CSA overlap).

Never final: it rolls forward.  A snapshot is usable only at exactly its own position H,
holding exactly ``tail_need(H)`` rows.
"""
from typing import NamedTuple

from spec.common import FREE, memory_machine, tail_need
from spec.dual import And


class TailRec(NamedTuple):
    st: int = FREE
    ver: int = 0
    pins: int = 0
    ep: int = 0
    draft: int = 0
    pub: int = 0      # 1 while published in the prefix index (reachable by lookups)
    h: int = 0      # position the snapshot was taken at
    rows: int = 0   # raw rows held

    CONTENT = ("h", "rows")

    def partial_at(self, p, c):
        return dict(h=p, rows=0)

    def completed(self, c):
        return dict(rows=tail_need(self.h, c.ratio, c.overlap))


def can_seal(o, c):
    """Readable only once the open window is fully written, and only once published in the
    index (a draft never is; an unpublished copy must be released, never kept)."""
    return And(o.rows == tail_need(o.h, c.ratio, c.overlap), o.pub == 1)


def needs_snapshot(H, c):
    """A checkpoint at H holds a tail snapshot only where the open window holds rows: with
    none (an HCA tail on its ratio's boundary) a fresh tail written at H (``write``: rows 0)
    already is the state a resume at H needs."""
    return tail_need(H, c.ratio, c.overlap) > 0


def covers(o, H, c):
    return o.h == H


def checkpoint(o):
    """The position this object was checkpointed at (its own h): usable off its group's block
    boundary only at exactly this H."""
    return o.h


UncompressedTailMachine = memory_machine("UncompressedTailMachine", __name__, __doc__, can_seal)
