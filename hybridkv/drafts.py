"""Draft (speculative) tokens: written into separate draft=1 objects, never published.
accept re-writes the accepted prefix as regular objects (copying the draft blocks' data)
and commits it; reject frees every draft object, so the request's tail, window and indexer
objects are exactly what they were before the drafts."""
from hybridkv import alloc as A
from hybridkv.errors import BadArgument, RequestBusy
from hybridkv.calls import locked


def _reject_all(mgr, req):
    for wo in req.drafts:
        mgr.pools[(wo.ref.kind, wo.ref.group)].fire(wo.ref.block, "reject")
    req.drafts, req.D = [], 0


@locked
def reject_drafts(self, request_id):
    req = self._req(request_id)
    if not req.D:
        raise RequestBusy("no pending drafts", request_id)
    _reject_all(self, req)


@locked
def accept_drafts(self, request_id, token_ids):
    """Accept the first len(token_ids) drafts (their ids), reject the rest, commit them."""
    req = self._req(request_id)
    tokens = self._tokens(token_ids)
    if not req.D:
        raise RequestBusy("no pending drafts", request_id)
    if len(tokens) > req.D:
        raise BadArgument("more accepted tokens than drafts", (len(tokens), req.D))
    if req.L != req.A:
        raise RequestBusy("commit the allocated tokens before accepting drafts", (req.L, req.A))
    j, start = len(tokens), req.A
    tags_before = {P: set(t) for P, t in req.tags.items()}
    pts = A.snapshot_points(self, req, start, start + j)
    work = frozenset((k, g, w.block_end) for (k, g), w in req.work.items())
    need = A.blocks_needed(self.layout, start, start + j, pts, reuse_work=work)
    for wo in req.drafts:
        pk = (wo.ref.kind, wo.ref.group)
        if pk in need:
            need[pk] -= 1
    try:
        A.admission(self, {pk: k for pk, k in need.items() if k > 0})
    except Exception:
        req.tags = tags_before
        raise
    data = {(wo.ref.kind, wo.ref.group, wo.block_end):
            self.pools[(wo.ref.kind, wo.ref.group)].view(wo.ref.block).clone()
            for wo in req.drafts if not wo.exact}
    _reject_all(self, req)
    for pk, k in need.items():
        A.make_room(self, pk, k)
    new = A.write_objects(self, req, start, start + j, pts)
    for wo in new:
        src = data.get((wo.ref.kind, wo.ref.group, wo.block_end))
        if src is not None and not wo.exact:
            self.pools[(wo.ref.kind, wo.ref.group)].view(wo.ref.block).copy_(src)
    for P in pts:
        req.snap_count[P] = sum(1 for w in req.own if w.exact and w.p == P)
    req.points += [P for P in pts if P not in req.points]
    req.A = start + j
    A.publish(self, req)
    self.commit(request_id, j, tokens)
