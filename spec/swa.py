"""SWA window: raw per-token KV of the last W tokens, valid on the interval [lo, hi).

Window churn frees the oldest rows of an unpinned window (``slide``), so validity is always
judged against the resume point: [first_read(H), H) must lie inside [lo, hi), where
first_read(H) is H - W under a sliding window and the start of H's chunk under chunked-local
attention (``c.chunk`` > 0: a query reads its own chunk only; W is the chunk).
"""
from typing import NamedTuple

from spec.common import FREE, memory_machine
from spec.dual import And, If, Max, Mod


class SwaRec(NamedTuple):
    st: int = FREE
    ver: int = 0
    pins: int = 0
    ep: int = 0
    draft: int = 0
    pub: int = 0      # 1 while published in the prefix index (reachable by lookups)
    hi: int = 0   # one past the newest valid token
    lo: int = 0   # oldest valid token

    CONTENT = ("hi", "lo")

    def partial_at(self, p, c):
        return dict(hi=p, lo=p)

    def completed(self, c):
        return dict(lo=first_read(self.hi, c))


def can_seal(o, c):
    """Readable only once published in the index (a draft never is; an unpublished copy must
    be released, never kept); the interval itself is checked against H at lookup."""
    return o.pub == 1


def can_slide(o, c):
    """Churn may free the oldest row while one remains; the content changes, so the object
    is re-versioned (a reader that checked it before must notice)."""
    return And(o.lo < o.hi, o.ver < c.max_ver)


def slide(o, c):
    return o._replace(lo=o.lo + 1, ver=o.ver + 1)


def first_read(H, c):
    """The oldest row a resume at H needs: H - W (sliding window), the start of H's chunk
    (chunked-local attention, ``c.chunk`` > 0)."""
    return If(c.chunk > 0, H - Mod(H, Max(c.chunk, 1)), Max(0, H - c.window))


def covers(o, H, c):
    return And(o.hi >= H, o.lo <= first_read(H, c))


def checkpoint(o):
    """The position this window was checkpointed at (one past its newest token): usable off
    its group's block boundary only at exactly this H."""
    return o.hi


SwaWindowMachine = memory_machine(
    "SwaWindowMachine", __name__, __doc__, can_seal,
    extra=lambda s: {"slide": s["ready"].to.itself(cond=can_slide)})
