"""What the four in-memory object kinds share: state values, pin/version/epoch fields,
their guards and effects.  Kind files add their content fields and readiness rule."""
from spec.dual import Div, Max, Or

FREE, WRITING, READY, PINNED, LOADING, STALE = range(6)


def readable(st):
    return Or(st == READY, st == PINNED)


def can_evict(o, c):
    """Retiring published content mints a new version, so a reader that checked the old
    one notices; the version counter must not wrap (ABA)."""
    return o.ver < c.max_ver


def can_relocate(o, c):
    """Only an unpinned object moves (the machine has no move out of pinned); epochs never wrap."""
    return o.ep < c.max_ep


def can_unpin_keep(o, c):
    return o.pins > 1


def can_publish(o, c):
    """Only state of verified tokens enters the prefix index: never a draft's."""
    return o.draft == 0


def tail_need(H, m, overlap):
    """Rows the compressor's open window holds at H: H mod m, plus the overlap rows of the
    previous window once one has closed (CSA: entry j pools rows [m*j - overlap, m*j + m))."""
    return H - Max(0, m * Div(H, m) - overlap)


# effects shared by every memory kind --------------------------------------------------
def write(o, c, p, draft=0):
    return o._replace(draft=draft, **o.partial_at(p, c))


def fill(o, c):
    return o._replace(**o.completed(c))


def accept(o, c):
    return o._replace(draft=0)


def publish(o, c):
    return o._replace(pub=1)


def pin(o, c):
    return o._replace(pins=o.pins + 1)


def unpin(o, c):
    return o._replace(pins=o.pins - 1)


def relocate(o, c):
    return o._replace(ep=o.ep + 1)


def discard(o, c):
    return o._replace(pins=0, draft=0, pub=0, **{f: 0 for f in o.CONTENT})


def evict(o, c):
    return discard(o, c)._replace(ver=o.ver + 1)


def load_ok(o, c, payload):
    """A verified copy becomes readable under the index key it was spilled from."""
    return o._replace(pub=1, **dict(zip(o.CONTENT, payload)))


def content(o):
    """The kind's content fields padded to the 3-slot disk payload."""
    vals = tuple(getattr(o, f) for f in o.CONTENT)
    return vals + (0,) * (3 - len(vals))


def memory_machine(name, module, doc, can_seal, extra=lambda states: {}):
    """Declare a memory kind's StateMachine: the lifecycle every kind shares, plus the
    states and events ``extra(states)`` adds.  States are fresh per class."""
    from statemachine import State, StateMachine

    s = dict(free=State(initial=True, value=FREE), writing=State(value=WRITING),
             ready=State(value=READY), pinned=State(value=PINNED),
             loading=State(value=LOADING))
    free, writing, ready, pinned, loading = s.values()
    ns = dict(s, __module__=module, __doc__=doc)
    ns.update(
        write=free.to(writing),
        draft=free.to(writing),
        fill=writing.to.itself(),
        accept=writing.to.itself(),
        reject=writing.to(free),
        publish=writing.to.itself(cond=can_publish),
        seal=writing.to(ready, cond=can_seal),
        pin=ready.to(pinned) | pinned.to.itself(),
        unpin=pinned.to.itself(cond=can_unpin_keep) | pinned.to(ready),
        relocate=ready.to.itself(cond=can_relocate),
        evict=ready.to(free, cond=can_evict),
        load_start=free.to(loading),
        load_ok=loading.to(ready),
        load_bad=loading.to(free),
    )
    ns.update(extra(s))
    return type(StateMachine)(name, (StateMachine,), ns)
