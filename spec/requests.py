"""Request and graph actions: lookup -> pin -> launch -> release, capture and replay."""
from spec.common import PINNED
from spec.dual import And, Eq, If, Select, Store
from spec.state import HELD, IDLE, KINDS, LOOKED, RUNNING, refs_of  # noqa: F401
from spec.system import (G, R, REFS, P, _all_refs, _eps_now, _req, action, can_capture,
                         can_forget, can_launch, can_lookup, can_pin, can_release,
                         can_replay_graph)


_ZEROS = (0,) * len(KINDS)
_IDLE = dict(ph=IDLE, H=0, ref=_ZEROS, pv=_ZEROS, pe=_ZEROS)   # idle requests forget everything


@action(R, REFS, P)
def lookup(s, c, r, ref, H):
    objs = refs_of(s, ref)
    return can_lookup(s, c, r, ref, H), _req(
        s, r, ph=LOOKED, H=H, ref=tuple(ref),
        pv=tuple(o.ver for o in objs), pe=tuple(o.ep for o in objs))


@action(R)
def pin(s, c, r):
    en, s2 = _all_refs(s, c, r, "pin")
    return And(can_pin(s, c, r), en), _req(s2, r, ph=HELD)


@action(R)
def launch(s, c, r):
    return can_launch(s, c, r), _req(s, r, ph=RUNNING)


@action(R)
def release(s, c, r):
    en, s2 = _all_refs(s, c, r, "unpin")
    return And(can_release(s, c, r), en), _req(s2, r, **_IDLE)


@action(R)
def forget(s, c, r):
    return can_forget(s, c, r), _req(s, r, **_IDLE)


def _graph(s, g, **fields):
    return s._replace(graph=Store(s.graph, g, Select(s.graph, g)._replace(**fields)))


@action(G, R)
def capture(s, c, g, r):
    q = Select(s.req, r)
    # history: a graph bakes in addresses; did it bake in one its request had not pinned
    # and validated (I3 for the capture itself)?  Replays then trust those addresses.
    sound = And(*[And(o.st == PINNED, o.ver == q.pv[k], o.ep == q.pe[k])
                  for k, o in enumerate(refs_of(s, q.ref))])
    return can_capture(s, c, g, r), _graph(s, g, cap=1, ref=q.ref, eps=_eps_now(s, q.ref),
                                           bad=If(sound, Select(s.graph, g).bad, 1))


@action(G)
def replay(s, c, g):
    gr = Select(s.graph, g)
    # history: did this replay read an address that moved or was never captured?
    sound = And(gr.cap == 1, Eq(gr.eps, _eps_now(s, gr.ref)))
    return can_replay_graph(s, c, g), _graph(s, g, bad=If(sound, gr.bad, 1))


@action(G)
def release_graph(s, c, g):
    return True, _graph(s, g, cap=0, ref=_ZEROS, eps=_ZEROS)


