"""Allocation, commit, release and eviction: the object lifecycle behind CacheManager.

Objects of one request (each one pool block with one spec record):
  chain blocks  per compressed group and chain kind (comp, idx): block b covers tokens
                [b*bs, (b+1)*bs).  Written with p = min(block end, allocation end); a block
                still open at the allocation end is the request's *working* block and is
                re-written (reject + write, same block) when the next allocation extends it.
                Sealed when complete, published under its chain key, pinned by its writer.
  snapshots     at each retention point P (index.retention_points): per group the window at
                P, and per compressed group the tail at P and a copy of the open block at P;
                the indexer's object at P.  Published under their ``ckpt`` keys with a
                Checkpoint record as soon as the tokens up to P are known (so another lookup
                may meet them still WRITING: a hash hit with incomplete state).
  drafts        the same shapes past the allocation end, written with draft=1, never published;
                accept re-writes them as regular objects, reject frees them.
``blocks_needed`` is the one sizing function: admission and ``pool_sizes`` both use it.
Eviction (eligibility, drop, make_room) is hybridkv.evict, re-exported here.
"""
from typing import NamedTuple

from hybridkv.errors import AdmissionRefused
from hybridkv.evict import (admit_entry, drop, make_eligible, make_ineligible,  # noqa: F401
                            make_room)   # eviction per pool: hybridkv.evict (re-exported)
from hybridkv.index import Checkpoint, obj_key, retention_points
from hybridkv.pools import ObjRef
from hybridkv.lookup import Read
from spec.common import FREE, PINNED, WRITING
from spec.system import can_admit


class WObj(NamedTuple):
    ref: ObjRef
    p: int               # position the object is written at (spec write(p))
    exact: bool          # a snapshot at exactly p (else a chain block)
    block_end: int       # chain blocks: end of the block's token range


class _TransitView(NamedTuple):      # what spec.system.can_admit reads: states in transit
    mem: tuple
    disk: tuple


class _CapCfg(NamedTuple):
    cap: int


_W = (type("W", (), {"st": WRITING})(),)


def admits(mgr, extra):
    """spec.system.can_admit for ``extra`` more objects entering transit at once."""
    n = sum(p.n_writing for p in mgr.pools.values()) + mgr.disk_transit() + extra - 1
    return can_admit(_TransitView((_W * max(n, 0),), ()), _CapCfg(mgr.cap)) if extra else True


def plan_objects(layout, start, end, points, draft_end=None):
    """[(kind, group, p, exact, block_end)] an allocation (start, end] writes; with
    ``draft_end`` the draft objects of (end, draft_end] instead."""
    lo, hi = (start, end) if draft_end is None else (end, draft_end)
    out = []
    for g in layout.groups:
        bs = g.block_size
        for kind in ("comp", "idx"):
            if kind in g.kinds:
                for b in range(lo // bs, -(-hi // bs)):
                    out.append((kind, g.name, min((b + 1) * bs, hi), False, (b + 1) * bs))
        for P in (points if draft_end is None else [draft_end]):
            if g.compressed and P % bs:
                out.append(("comp", g.name, P, True, P))
            out += [(k, g.name, P, True, P) for k in ("tail", "swa", "idx") if k in g.kinds]
    return out


def blocks_needed(layout, start, end, points=(), draft_end=None, reuse_work=frozenset()):
    """New blocks per (kind, group) for an allocation: the one sizing function."""
    need = {}
    for kind, g, p, exact, be in plan_objects(layout, start, end, points, draft_end):
        if not exact and (kind, g, be) in reuse_work:
            continue
        need[(kind, g)] = need.get((kind, g), 0) + 1
    return need


def pool_sizes(layout, max_tokens, max_requests, every_n=0):
    """Pool sizes that hold ``max_requests`` requests of ``max_tokens`` each, with their
    retained checkpoints (same formula the admission check uses)."""
    pts = list(range(every_n, max_tokens + 1, every_n)) if every_n else []
    pts = sorted(set(pts) | {max_tokens - max_tokens % layout.granule} - {0})
    need = blocks_needed(layout, 0, max_tokens, pts)
    return {pk: max(1, need.get(pk, 0) * max_requests) for pk in layout.pool_keys()}


def admission(mgr, need, protect=()):
    """Raise AdmissionRefused (changing nothing) unless every pool can supply its blocks
    from free + evictable ones (minus ``protect``ed blocks) and the cap admits them."""
    short = {}
    for pk, k in need.items():
        pool, ev = mgr.pools[pk], mgr.evictable[pk]
        avail = pool.n_free + len(ev) - sum(1 for r in protect if (r.kind, r.group) == pk
                                            and r.block in ev)
        if k > avail:
            short[f"{pk[0]}/{pk[1]}"] = (k, avail)
    total = sum(need.values())
    if not admits(mgr, total):
        short["in_transit"] = (total, mgr.cap - sum(p.n_writing for p in mgr.pools.values()))
    if short:
        raise AdmissionRefused("allocation refused", short)


# -- writing -------------------------------------------------------------------------------------
def write_objects(mgr, req, start, end, points, draft_end=None):
    """Write every object of the allocation (drafts with draft=1; regular ones are added
    to ``req.own``); blocks come from the free lists (room was made by the caller)."""
    out = []
    draft = 0 if draft_end is None else 1
    for kind, g, p, exact, be in plan_objects(mgr.layout, start, end, points, draft_end):
        pool = mgr.pools[(kind, g)]
        w = req.work.get((kind, g))
        if not draft and not exact and w is not None and w.block_end == be:
            pool.fire(w.ref.block, "reject")            # extend the open block: same address
            b = w.ref.block
            del req.work[(kind, g)]
            req.own = [x for x in req.own if x.ref != w.ref]
        else:
            b = pool.alloc()
            src = req.cow.get((kind, g, be)) if not exact else None
            if draft and not exact and w is not None and w.block_end == be:
                src = w.ref                              # a draft continues the open block
            if src is not None:                          # open block continued (hit / draft)
                pool.view(b).copy_(pool.view(src.block))
        pool.write(b, p, draft)
        wo = WObj(ObjRef(kind, g, b), p, exact, be)
        out.append(wo)
        if not draft:
            req.own.append(wo)
        if not exact and p < be and not draft:
            req.work[(kind, g)] = wo
    return out


def publish(mgr, req):
    """Publish the request's objects (and checkpoint records) whose tokens are now known."""
    gran, keys, index = mgr.layout.granule, req.keys, mgr.index
    known = len(keys) * gran
    for wo in req.own:
        if wo.p > known or wo.p % gran or (not wo.exact and wo.p < wo.block_end) or \
                wo.ref in req.pubd:
            continue
        key = obj_key(keys[wo.p // gran - 1], wo.ref.group, b"ckpt" if wo.exact else b"chain")
        if index.put(wo.ref.kind, wo.ref.group, key, wo.ref.block):
            req.pubd.add(wo.ref)
            mgr.pools[(wo.ref.kind, wo.ref.group)].touch(wo.ref.block)
    for P in [P for P in req.points if P <= known and P not in req.recorded]:
        index.add_checkpoint(Checkpoint(P, keys[P // gran - 1], index.needs(keys, P)))
        req.recorded.add(P)


def seal_committed(mgr, req):
    """Fill + seal every regular object now fully committed; pin chain blocks for the
    writer, keep snapshots as the request's provisional/retained checkpoints."""
    keep = []
    for wo in req.own:
        if wo.p > req.L or (not wo.exact and wo.p < wo.block_end):
            keep.append(wo)
            continue
        pool = mgr.pools[(wo.ref.kind, wo.ref.group)]
        if wo.exact and wo.ref.kind == "comp":           # the checkpoint's copy of the open block
            w = req.work.get(("comp", wo.ref.group))
            if w is not None:
                pool.view(wo.ref.block).copy_(pool.view(w.ref.block))
        pool.fire(wo.ref.block, "fill")
        rec = pool.fire(wo.ref.block, "seal")
        if wo.exact:
            req.snaps.setdefault(wo.p, []).append(wo)
            req.snap_ver[wo.ref] = rec.ver
        else:
            rec = pool.fire(wo.ref.block, "pin")
            req.reads.append(Read(wo.ref, wo.p, rec.ver, rec.ep))
            if wo.ref in req.pubd:
                admit_entry(mgr, wo.ref, wo.p, False)
    req.own = keep
    for P in sorted(req.snaps):
        done = len(req.snaps[P]) == req.snap_count.get(P, -1)
        if done and P < req.L and req.tags.get(P) == {"end"} and \
                any(Q > P and len(req.snaps.get(Q, ())) == req.snap_count.get(Q) for Q in req.snaps):
            release_snapshot(mgr, req, P)                # superseded provisional end
    for P, objs in req.snaps.items():
        if req.tags.get(P, set()) - {"end"}:
            for wo in objs:
                retain(mgr, req, wo)


def snapshot_live(mgr, req, wo):
    """The block still holds this request's snapshot: an eviction (by another request's
    allocation, or a sweep) bumps its version, after which the block is someone else's."""
    rec = mgr.pools[(wo.ref.kind, wo.ref.group)].recs[wo.ref.block]
    return rec.st != FREE and rec.ver == req.snap_ver.get(wo.ref)


def retain(mgr, req, wo):
    if wo.ref in req.pubd and snapshot_live(mgr, req, wo):
        admit_entry(mgr, wo.ref, wo.p, True)
        make_eligible(mgr, wo.ref)


def release_snapshot(mgr, req, P):
    """Give back a superseded snapshot.  Blocks already evicted are skipped; a block another
    request has pinned (it hit this snapshot) stays cached for the policy to evict later."""
    for wo in req.snaps.pop(P):
        if snapshot_live(mgr, req, wo):
            if mgr.pools[(wo.ref.kind, wo.ref.group)].recs[wo.ref.block].st == PINNED:
                retain(mgr, req, wo)
            else:
                drop(mgr, wo.ref)
        req.snap_ver.pop(wo.ref, None)
        req.pubd.discard(wo.ref)
    ck = mgr.index.ckpts.get(req.keys[P // mgr.layout.granule - 1])
    if ck is not None and all(mgr.index.get(n.kind, n.group, n.key) is None
                              for n in ck.needs if n.exact):
        del mgr.index.ckpts[ck.key]


def snapshot_points(mgr, req, start, end):
    pol = next(iter(mgr.policies.values()))
    pts = retention_points(pol, start, end, req.branch, mgr.layout.granule, mgr.every_n)
    for P in pts:
        tags = req.tags.setdefault(P, set())
        tags.add("branch" if P == req.branch else
                 ("every" if mgr.every_n and P % mgr.every_n == 0 else "end"))
        if P == end - end % mgr.layout.granule:
            tags.add("end")
    return pts
