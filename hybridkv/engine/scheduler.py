"""Continuous-batching bookkeeping: requests, the waiting queue and the running set.

Iteration-level scheduling: every engine step gives each running request one unit of work
(a prefill chunk of at most ``chunk`` tokens, cut at absolute multiples of ``chunk``, or one
decode step, possibly with drafts) within a per-step token budget; finished requests leave and
waiting ones are admitted between steps.  Preemption picks the most recently admitted running
request; a preempted request goes back to the front of the queue and later resumes through a
fresh lookup (its generated tokens are part of its prompt then).
"""
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Optional


class RequestOutput(NamedTuple):
    index: int               # position in the generate() call's prompt list
    prompt: tuple
    tokens: tuple            # generated tokens
    salt: bytes
    schedule: tuple          # chunk bounds the final model state went through, from 0
    reused_tokens: int       # tokens taken from a model checkpoint (sum over admissions)
    recomputed_tokens: int   # tokens the model computed (sum over admissions)
    hits: tuple              # HitPlan per admission
    preemptions: int
    drafted: int
    accepted: int
    disk_hits: int = 0       # admissions that resumed at an H reached through disk loads


@dataclass(eq=False)
class Request:
    index: int
    rid: object
    prompt: list
    salt: bytes
    max_new: int
    out: list = field(default_factory=list)
    state: Optional[object] = None
    schedule: list = field(default_factory=list)
    logits: Optional[object] = None       # last row of the last forward (next-token logits)
    reused: int = 0
    recomputed: int = 0
    hits: list = field(default_factory=list)
    preemptions: int = 0
    drafted: int = 0
    accepted: int = 0
    missing_ckpt: int = 0
    disk_hits: int = 0

    @property
    def seq(self):
        return self.prompt + self.out

    @property
    def done(self):
        return len(self.out) >= self.max_new

    def result(self):
        return RequestOutput(self.index, tuple(self.prompt), tuple(self.out), self.salt,
                             tuple(self.schedule), self.reused, self.recomputed,
                             tuple(self.hits), self.preemptions, self.drafted, self.accepted,
                             self.disk_hits)


class CannotSchedule(Exception):
    """A request cannot be admitted even with nothing else running; ``value`` is its index."""

    def __init__(self, msg, value):
        self.value = value
        super().__init__(f"{msg}: {value!r}")


class Scheduler:
    def __init__(self, max_running=4, step_tokens=64):
        if max_running < 1 or step_tokens < 1:
            raise ValueError(f"bad scheduler sizes {(max_running, step_tokens)}")
        self.max_running, self.step_tokens = max_running, step_tokens
        self.waiting, self.running = deque(), []

    def add(self, req):
        self.waiting.append(req)

    def busy(self):
        return bool(self.waiting or self.running)

    def admissible(self):
        """Pop waiting requests while there is room in the running set."""
        while self.waiting and len(self.running) < self.max_running:
            yield self.waiting.popleft()

    def victim(self):
        return self.running[-1] if self.running else None

    def requeue(self, req):
        self.running.remove(req)
        self.waiting.appendleft(req)

    def finish(self, req):
        self.running.remove(req)
