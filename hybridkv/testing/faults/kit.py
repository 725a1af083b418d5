"""What every fault-matrix row measures, from the caller's side:

trials             how many faults were injected (or calls made under one)
wrong_outputs      a VERIFIED load whose destination differs from what was spilled, or a
                   non-verified load that changed the destination
crashes            an exception out of the tier's API (or a dead helper process)
unnamed_exceptions the part of ``crashes`` that is not a named DiskError
hangs              a call that did not return within its deadline (run in a helper thread,
                   so a hang is counted, never waited for)
intact_lost        an intact entry the tier dropped from its index or deleted
max_latency_ms     the slowest measured call, where a row measures latency

Every count must end at 0."""
import threading
import time
from typing import NamedTuple

import torch

from hybridkv.disk.format import DiskError, DiskMeta

META = DiskMeta("compressed_kv", abi=11, tok_lo=0, tok_hi=256)
SENTINEL = -12345.0
CALL_DEADLINE_S = 20.0


class FaultRow(NamedTuple):
    name: str
    outcome: str
    wrong_outputs: int
    crashes: int
    expected: bool = True   # the tier behaved as specified (miss / refusal / cancel ...)
    trials: int = 0
    unnamed_exceptions: int = 0
    hangs: int = 0
    intact_lost: int = 0
    max_latency_ms: float = None

    @property
    def bad(self):
        return bool(self.wrong_outputs or self.crashes or self.unnamed_exceptions or
                    self.hangs or self.intact_lost or not self.expected)

    def as_json(self):
        return {"name": self.name, "outcome": self.outcome if self.expected else
                f"UNEXPECTED: {self.outcome}", "trials": self.trials,
                "wrong_outputs": self.wrong_outputs, "crashes": self.crashes,
                "unnamed_exceptions": self.unnamed_exceptions, "hangs": self.hangs,
                "intact_lost": self.intact_lost, "max_latency_ms": self.max_latency_ms}


def key_for(i):
    return f"{i:032x}"


def payload(i, n=64 * 1024):
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(n // 4, generator=g).reshape(-1, 64)


class Counter:
    """Calls the tier like an engine would and counts what the module doc lists."""

    def __init__(self, deadline=CALL_DEADLINE_S, named=(DiskError,)):
        self.deadline, self.named = deadline, named
        self.wrong = self.crashes = self.unnamed = self.hangs = self.trials = 0
        self.intact_lost = 0
        self.max_seconds = None    # slowest call timed with ``timed``
        self.slowest = {}          # function name -> its slowest timed call, seconds
        self.notes = []

    def call(self, fn, *a, **kw):
        """``fn(*a, **kw)`` in a helper thread: its value, or None when it raised or did
        not return before the deadline."""
        return self._run(fn, a, kw)[0]

    def timed(self, fn, *a, **kw):
        """Like ``call``, and the seconds ``fn`` took count toward ``max_seconds``."""
        value, seconds = self._run(fn, a, kw)
        if seconds is not None:
            self.max_seconds = max(self.max_seconds or 0.0, seconds)
            name = getattr(fn, "__name__", repr(fn))
            self.slowest[name] = max(self.slowest.get(name, 0.0), seconds)
        return value

    def _run(self, fn, a, kw):
        box = {}

        def run():
            t0 = time.perf_counter()
            try:
                box["value"] = fn(*a, **kw)
            except Exception as e:    # noqa: BLE001 -- an escaping exception is what we count
                box["error"] = e
            box["seconds"] = time.perf_counter() - t0
        th = threading.Thread(target=run, daemon=True, name="hkv-fault-call")
        th.start()
        th.join(self.deadline)
        name = getattr(fn, "__name__", repr(fn))
        if th.is_alive():
            self.hangs += 1
            self.notes.append(f"{name} hung > {self.deadline:g} s")
            return None, None
        e = box.get("error")
        if e is not None:
            self.crashes += 1
            self.unnamed += not isinstance(e, self.named)
            self.notes.append(f"{name} raised {type(e).__name__}: {e}")
        return box.get("value"), box["seconds"]

    def load(self, tier, key, orig, meta=META, allowed=None):
        self.trials += 1
        dest = torch.full_like(orig, SENTINEL)
        r = self.call(tier.load, key, dest, meta, 10.0)
        if r is None:
            return None
        if r.ok:
            ok = torch.equal(dest, orig) if allowed is None else \
                any(torch.equal(dest, a) for a in allowed)
            self.wrong += not ok
        else:
            self.wrong += not bool((dest == SENTINEL).all())
        return r

    def row(self, name, outcome, expected, trials=None):
        if self.notes:
            outcome += "; " + "; ".join(self.notes[:3])
        ms = None if self.max_seconds is None else round(self.max_seconds * 1e3, 3)
        return FaultRow(name, outcome, self.wrong, self.crashes, bool(expected),
                        self.trials if trials is None else trials, self.unnamed, self.hangs,
                        self.intact_lost, ms)
