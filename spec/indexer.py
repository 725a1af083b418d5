"""Indexer state: the lightning indexer's compressed keys and its own open window.

Usable at H only when synced up to exactly H and built by the model's current indexer
version; a version bump leaves older objects stale until they are rebuilt or evicted.
"""
from typing import NamedTuple

from statemachine import State

from spec.common import FREE, STALE, can_evict, memory_machine
from spec.dual import And


class IdxRec(NamedTuple):
    st: int = FREE
    ver: int = 0
    pins: int = 0
    ep: int = 0
    draft: int = 0
    pub: int = 0      # 1 while published in the prefix index (reachable by lookups)
    h: int = 0       # position of the checkpoint
    synced: int = 0  # tokens the indexer keys and tail are synced up to
    iv: int = 0      # indexer version the keys were built with

    CONTENT = ("h", "synced", "iv")

    def partial_at(self, p, c):
        return dict(h=p, synced=0, iv=c.miv)

    def completed(self, c):
        return dict(synced=self.h)


def can_seal(o, c):
    """Readable only once synced up to h, and only once published in the index (a draft
    never is; an unpublished copy must be released, never kept)."""
    return And(o.synced == o.h, o.pub == 1)


def can_mark_stale(o, c):
    """Only an object built by an older indexer version is stale."""
    return o.iv != c.miv


def covers(o, H, c):
    return And(o.h == H, o.iv == c.miv)


def checkpoint(o):
    """The position this object was checkpointed at (its own h): usable off its group's block
    boundary only at exactly this H."""
    return o.h


def _stale_events(s):
    stale = State(value=STALE)
    return {"stale": stale,
            "mark_stale": s["ready"].to(stale, cond=can_mark_stale),
            "drop_stale": stale.to(s["free"], cond=can_evict)}


IndexerMachine = memory_machine("IndexerMachine", __name__, __doc__, can_seal, extra=_stale_events)
