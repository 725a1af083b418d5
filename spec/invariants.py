"""The invariants (DESIGN §5), stated on the abstract state independently of the guards
that are meant to keep them, plus the auxiliary facts induction needs (``well_formed``)."""
from spec.common import FREE, LOADING, PINNED, READY, STALE, WRITING, tail_need
from spec.dual import And, Div, If, Implies, Items, Max, Mod, Not, Or
from spec.funnel import DISK_ALIGN
from spec.state import (D_CORRUPT, D_LOADING, D_VERIFIED, HELD, KIND_MODULES, KINDS, RUNNING,
                        ctx, holders, inflight, loaders, refs_of)

COMP, TAIL, SWA, IDX = range(len(KINDS))


def _sound_at(k, o, H, s, c):
    """What resuming at H actually needs of the object a running request reads."""
    need = {
        COMP: lambda: [o.closed >= Div(H, c.ratio)],
        TAIL: lambda: [o.h == H, o.rows == tail_need(H, c.ratio, c.overlap)],
        SWA: lambda: [o.lo <= If(c.chunk > 0, H - Mod(H, Max(c.chunk, 1)),  # its chunk
                                 Max(0, H - c.window)), o.hi >= H],
        IDX: lambda: [o.h == H, o.synced == H, o.iv == s.miv],
    }[k]()
    # a group's cached state is identified block by block: off its block boundary only a
    # checkpoint taken at exactly H is the right state
    at = KIND_MODULES[k].checkpoint(o)
    return And(o.st == PINNED, o.draft == 0, Or(Mod(H, c.blocks[k]) == 0, at == H), *need)


def hit_soundness(s, c):
    """No request computes from a prefix whose objects are not all ready at its H."""
    return And(*[Implies(r.ph == RUNNING,
                         And(Mod(r.H, c.granule) == 0, r.H >= 1,
                             *[_sound_at(k, o, r.H, s, c)
                               for k, o in enumerate(refs_of(s, r.ref))]))
                 for r in s.req])


def admission_cap(s, c):
    """I1: objects in transit never exceed the cap."""
    return inflight(s) <= c.cap


def state_routing(s, c):
    """I2: a load fills a block of the copy's own kind, and every loading block has exactly
    one loader of that kind."""
    return And(*[Implies(d.st == D_LOADING, d.tk == d.kind) for d in s.disk],
               *[Implies(o.st == LOADING, loaders(s, k, i) == 1)
                 for k, objs in enumerate(s.mem) for i, o in Items(objs)])


def toctou(s, c):
    """I3: what a running request reads is still pinned, at the version and address it
    checked."""
    return And(*[Implies(r.ph == RUNNING,
                         And(*[And(o.st == PINNED, o.ver == r.pv[k], o.ep == r.pe[k])
                               for k, o in enumerate(refs_of(s, r.ref))]))
                 for r in s.req])


def static_topology(s, c):
    """I4: no graph ever baked in an address its request had not pinned and validated, nor
    was replayed over a moved or uncaptured address."""
    return And(*[g.bad == 0 for g in s.graph])


def intact(d, c):
    """What a load really needs of a file: header intact, this build's ABI, payload offset
    and length whole DISK_ALIGN pages, payload matching its checksum."""
    return And(d.hdr == 1, d.abi == c.kabi, Mod(d.off, DISK_ALIGN) == 0,
               Mod(d.ln, DISK_ALIGN) == 0, d.ck == 1)


def disk_verdicts(s, c):
    """No good cached data is thrown away, no bad copy is used: a copy declared corrupt
    really fails the load checks, a verified copy really passes them."""
    return And(*[And(Implies(d.st == D_CORRUPT, Not(intact(d, c))),
                     Implies(d.st == D_VERIFIED, intact(d, c))) for d in s.disk])


def draft_isolation(s, c):
    """Draft state is never published: it exists only in unpublished objects still being
    written."""
    return And(*[Implies(o.draft == 1, And(o.st == WRITING, o.pub == 0))
                 for objs in s.mem for o in objs])


def accounting(s, c):
    """Every non-free object is exactly one of: held (pinned by a live request or a spill,
    being written or loaded) or published in the index (readable, or stale until its drop);
    no readable object outside the index (a leak), no free or loading object in it."""
    return And(*[And(Implies(Or(o.st == READY, o.st == PINNED, o.st == STALE), o.pub == 1),
                     Implies(Or(o.st == FREE, o.st == LOADING), o.pub == 0))
                 for objs in s.mem for o in objs])


def version_binding(s, c):
    """An indexer copy being loaded is of the model's current indexer version: a verified
    load publishes what it verified, never old keys as current ones."""
    return And(*[Implies(And(d.st == D_LOADING, d.kind == IDX), d.x == s.miv) for d in s.disk])


def _complete(k, o, c):
    return {COMP: lambda: o.closed == Div(o.h, c.ratio),
            TAIL: lambda: o.rows == tail_need(o.h, c.ratio, c.overlap),
            SWA: lambda: o.lo <= o.hi,
            IDX: lambda: o.synced == o.h}[k]()


def well_formed(s, c):
    """Auxiliary: pins count their holders, published objects are complete, stale means
    outdated, and every counter stays inside the model's bounds."""
    cx = ctx(s, c)
    facts = [s.miv <= c.max_iv]
    for k, objs in enumerate(s.mem):
        for i, o in Items(objs):
            facts += [o.pins == holders(s, k, i), (o.st == PINNED) == (o.pins >= 1),
                      Implies(Or(o.st == READY, o.st == PINNED, o.st == STALE),
                              _complete(k, o, c)),
                      Implies(o.st == FREE, o.draft == 0),
                      o.ver <= c.max_ver, o.ep <= c.max_ep, o.draft <= 1]
    facts += [And(Implies(o.st == STALE, o.iv != cx.miv), o.iv <= cx.miv) for o in s.mem[IDX]]
    for r in s.req:
        facts += [Implies(Or(r.ph == HELD, r.ph == RUNNING), r.H >= 1)]
    return And(*facts)


INVARIANTS = {f.__name__: f for f in (hit_soundness, admission_cap, state_routing, toctou,
                                      static_topology, draft_isolation, accounting,
                                      version_binding, disk_verdicts, well_formed)}
