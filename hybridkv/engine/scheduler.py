"""Continuous-batching bookkeeping: requests, the waiting queue and the running set.

Iteration-level scheduling: every engine step gives each running request one unit of work
(a chunk of known tokens of at most ``chunk`` tokens, cut at absolute multiples of ``chunk``
and at the cache's checkpoint positions, or one decode step, possibly with drafts) within a
per-step token budget, and runs all of it in one forward.  At most ``max_running`` requests
hold cache state at once; waiting ones are admitted between steps, in order.  A request that
cannot get blocks preempts the most recently admitted request younger than itself; with none,
it waits (back to the queue) unless it runs alone, in which case it can never fit.  So the
oldest request always progresses.  A preempted request goes back to the front of the queue and
later resumes through a fresh lookup (its generated tokens are part of its prompt then).
"""
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from hybridkv.errors import BadArgument, CacheError


class RequestOutput(NamedTuple):
    index: int               # position in the generate() call's prompt list
    prompt: tuple
    tokens: tuple            # generated tokens
    salt: bytes
    schedule: tuple          # chunk bounds the final admission computed, (a, b) each
    reused_tokens: int       # tokens taken from the cache (sum over admissions)
    recomputed_tokens: int   # tokens the model computed (sum over admissions)
    hits: tuple              # HitPlan per admission
    preemptions: int
    drafted: int
    accepted: int
    disk_hits: int = 0       # admissions that resumed at an H reached through disk loads
    error: Optional[CacheError] = None   # why it could not be served (e.g. RequestTooLarge)
    replans: int = 0         # launches or pins refused as stale, then looked up again


@dataclass(eq=False)
class Request:
    index: int
    rid: object
    prompt: list
    salt: bytes
    max_new: int
    out: list = field(default_factory=list)
    schedule: list = field(default_factory=list)
    started: bool = False     # holds cache state (looked up and counted as running)
    reused: int = 0
    recomputed: int = 0
    hits: list = field(default_factory=list)
    preemptions: int = 0
    drafted: int = 0
    accepted: int = 0
    disk_hits: int = 0
    replans: int = 0
    error: Optional[CacheError] = None

    @property
    def seq(self):
        return self.prompt + self.out

    @property
    def done(self):
        return self.error is not None or len(self.out) >= self.max_new

    def result(self):
        return RequestOutput(self.index, tuple(self.prompt), tuple(self.out), self.salt,
                             tuple(self.schedule), self.reused, self.recomputed,
                             tuple(self.hits), self.preemptions, self.drafted, self.accepted,
                             self.disk_hits, self.error, self.replans)


class CannotSchedule(CacheError):
    """A request cannot be admitted even with nothing else running; ``value`` is its index."""


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadArgument(f"{name} must be an int >= 1", v)


class Scheduler:
    def __init__(self, max_running=4, step_tokens=64):
        _positive("max_running", max_running)
        _positive("step_tokens", step_tokens)
        self.max_running, self.step_tokens = max_running, step_tokens
        self.waiting, self.running = deque(), []

    def add(self, req):
        self.waiting.append(req)

    def busy(self):
        return bool(self.waiting or self.running)

    def admit(self):
        """The next waiting request if the running set has room (it is counted running at
        once), else None."""
        if self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            self.running.append(req)
            return req
        return None

    def victim(self, of):
        """The most recently admitted running request admitted after ``of`` (a request only
        preempts younger ones, so the oldest always progresses), or None."""
        later = self.running[self.running.index(of) + 1:]
        return later[-1] if later else None

    def requeue(self, req):
        self.running.remove(req)
        self.waiting.appendleft(req)

    def finish(self, req):
        self.running.remove(req)
