"""Compressed KV: CSA/HCA entries, one per m tokens, final once their window closes.

Resuming at H needs every entry whose window lies below H: ``closed >= H // m``.
"""
from typing import NamedTuple

from spec.common import FREE, memory_machine
from spec.dual import And, Div


class CompRec(NamedTuple):
    st: int = FREE
    ver: int = 0
    pins: int = 0
    ep: int = 0
    draft: int = 0
    pub: int = 0      # 1 while published in the prefix index (reachable by lookups)
    h: int = 0        # tokens the object covers
    closed: int = 0   # entries closed (final) so far

    CONTENT = ("h", "closed")

    def partial_at(self, p, c):
        return dict(h=p, closed=0)

    def completed(self, c):
        return dict(closed=Div(self.h, c.ratio))


def can_seal(o, c):
    """Readable only when every window below h has closed, and only once published in the
    index (a draft never is; an unpublished copy must be released, never kept)."""
    return And(o.closed == Div(o.h, c.ratio), o.pub == 1)


def covers(o, H, c):
    """Lookup's view: this object covers the first H tokens."""
    return o.h >= H


def checkpoint(o):
    """The position this object was checkpointed at (its own h): usable off its group's block
    boundary only at exactly this H."""
    return o.h


CompressedKVMachine = memory_machine("CompressedKVMachine", __name__, __doc__, can_seal)
