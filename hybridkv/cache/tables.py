"""Hot-path transition tables compiled from the spec's machine classes.

python-statemachine is the declaration (~75-200 µs a transition); the runtime fires
``(state, event) -> [(guards, target)]`` rows holding the very same guard functions.
``target_many`` runs a whole run of blocks through the same rows at once: each guard is called
once over the run's records as numpy columns (spec.dual's array mode).
``CheckedMachine`` drives a real machine instance beside the table and fails loudly when
the two disagree (checked mode).
"""
import numpy as np

from spec.state import KINDS
from spec.table import compile_machine

NO_LIMIT = 1 << 62
REFUSED = -1     # target_many's entry for a block whose event is refused


class TransitionRefused(Exception):
    """An event is not allowed in the object's state, or its guard is false."""

    def __init__(self, machine, state, event):
        super().__init__(f"{machine}: event {event!r} refused in state {state!r}")
        self.machine, self.state, self.event = machine, state, event


class Table:
    """Flat transition table of one machine class."""

    def __init__(self, machine_cls):
        self.name = machine_cls.__name__
        self.machine_cls = machine_cls
        self.rows = {}
        for event, rows in compile_machine(machine_cls).items():
            for r in rows:
                self.rows.setdefault((r.source, event), []).append((r.guards, r.target))
        self.states = {s.value: s.id for s in machine_cls.states}

    def target(self, st, event, o, c):
        """The state ``event`` leads to from ``st``, or None when refused."""
        for guards, tgt in self.rows.get((st, event), ()):
            for g in guards:
                if not g(o, c):
                    break
            else:
                return tgt
        return None

    def target_many(self, sts, event, o, c):
        """``target`` for a run of blocks: ``sts`` their states and ``o`` their records, as
        numpy columns.  Per distinct state, rows are tried in order as ``target`` tries them,
        each guard called once over the run (guards are pure, so evaluating one on blocks of
        another state is harmless: the mask drops them).  Returns each block's target state,
        REFUSED where the event is refused."""
        out = np.full(len(sts), REFUSED, dtype=np.int64)
        for st in distinct(sts):
            left = sts == st
            for guards, tgt in self.rows.get((st, event), ()):
                hit = left
                for g in guards:
                    hit = hit & g(o, c)
                out[hit] = tgt
                left = left & ~hit
        return out

    def fire(self, st, event, o, c):
        tgt = self.target(st, event, o, c)
        if tgt is None:
            raise TransitionRefused(self.name, self.states.get(st, st), event)
        return tgt


class CheckedMachine:
    """A real python-statemachine instance that shadows one object's table transitions."""

    def __init__(self, table):
        self.table = table
        self.sm = table.machine_cls()

    def follow(self, st, event, o, c, expected):
        """Fire ``event`` on the real machine (which must be in ``st``) and assert it lands
        where the table said."""
        assert self.sm.current_state_value == st, (self.table.name, self.sm.current_state_value, st)
        self.sm.send(event, o=o, c=c)
        got = self.sm.current_state_value
        assert got == expected, f"{self.table.name}: machine went to {got}, table to {expected}"


class GroupCtx:
    """What a guard reads besides its record (spec.config.Ctx's fields for one group)."""
    __slots__ = ("ratio", "overlap", "window", "chunk", "max_ver", "max_ep", "miv", "kabi",
                 "blocks")

    def __init__(self, g, max_ver=NO_LIMIT, max_ep=NO_LIMIT, miv=0, kabi=0):
        self.ratio, self.overlap, self.window, self.chunk = g.ratio, g.overlap, g.window, g.chunk
        self.blocks = (g.block_size,) * len(KINDS)     # per kind, in KINDS order
        self.max_ver, self.max_ep, self.miv, self.kabi = max_ver, max_ep, miv, kabi


DISTINCT_PEELS = 4     # ``distinct`` peels this many values off a column before a set


def distinct(col):
    """The distinct values of an int column, ascending, as Python ints: a run's usual column
    holds one value or a few, each found with one comparison over what is left; else a set of
    its values (np.unique costs several Python-level calls, and its first call imports
    numpy.ma: milliseconds)."""
    found = []
    while len(col) and len(found) < DISTINCT_PEELS:
        first = int(col[0])
        found.append(first)
        rest = col != first
        if not rest.any():
            return sorted(found)
        col = col[rest]
    return sorted(found + list(set(col.tolist())))    # the rest of a many-valued column


_CACHE = {}


def table_for(machine_cls):
    if machine_cls not in _CACHE:
        _CACHE[machine_cls] = Table(machine_cls)
    return _CACHE[machine_cls]
