"""The runtime's hit-validation funnel over the spec predicates, and the HitPlan.

For each checkpoint on the prompt's chain (longest first) and each group:
  layer 1  spec.funnel.can_hit_aligned (granule; group block boundary or exact snapshot),
  layer 2  spec.funnel.can_hit_abi (stored ABI of each object vs the kernel's),
  layer 3  per object: spec.common.readable + the kind's spec ``covers(o, at, c)``
           (READY_CHECKS), then spec.funnel.can_hit_groups over all groups (intersection),
  layer 4  spec.funnel.can_hit_bytes on every block's address and length.
The resume point is spec.funnel.best_hit over the candidates; everything rejected is
reported with its layer and reason.  Lookup reads state only: no pin, no policy access
(with a disk tier it first reaps finished loads: verified copies become published blocks).

Disk (manager with a DiskTier): an object missing from memory whose copy is on disk or
loading is *deferred*: never a read, rejected at layer 3 with check ``disk``.  The longest
H whose groups fail only by deferral is reported in ``disk`` / ``disk_tokens`` with the cost
model's ``disk_choice`` (load | wait | recompute) overall and per group (``disk_groups``);
``CacheManager.prefetch`` starts those loads and a later lookup reuses them once verified.
"""
from typing import NamedTuple

from hybridkv import diskplan
from hybridkv.index import Checkpoint

from spec import compressed, indexer, swa, tail
from spec.common import readable
from spec.funnel import best_hit, can_hit_abi, can_hit_aligned, can_hit_groups
from hybridkv.pools import ObjRef

KIND_MODULE = {"comp": compressed, "tail": tail, "swa": swa, "idx": indexer}
STATE_NAMES = ("free", "writing", "ready", "pinned", "loading", "stale")


def _readable(mod, rec, at, cx):
    return readable(rec.st)


def _covers(mod, rec, at, cx):
    return mod.covers(rec, at, cx)


# kind -> ordered (name, check); every check is a spec predicate.  Tests drop one of them
# (monkeypatch) to seed a bug the stateful conformance test must find.
READY_CHECKS = {k: [("readable", _readable), ("covers", _covers)] for k in KIND_MODULE}


def object_ready(kind, rec, at, cx):
    """(ok, failing check name or None) for one object that must cover ``at``."""
    mod = KIND_MODULE[kind]
    for name, fn in READY_CHECKS[kind]:
        if not fn(mod, rec, at, cx):
            return False, name
    return True, None


class Rejection(NamedTuple):
    H: int
    group: str
    layer: int          # funnel layer 1-4
    check: str          # aligned | abi | missing | readable | covers | bytes
    reason: str


class Read(NamedTuple):
    ref: ObjRef
    at: int
    ver: int
    ep: int


class HitPlan(NamedTuple):
    reuse_tokens: int
    group_hits: dict        # group -> longest H this group alone could resume at
    rejections: tuple       # Rejection, longest H first
    candidates: tuple       # checkpoint positions considered, longest first
    reads: tuple            # Read: what resuming at reuse_tokens pins and re-checks
    branch: int             # length of the cached compressed chain (Marconi branch point)
    prompt_tokens: int
    disk: tuple = ()        # spill.DiskRead: objects a resume at disk_tokens needs from disk
    disk_tokens: int = 0    # H reachable once those loads verify (0: none)
    disk_choice: str = ""   # load | wait | recompute ("" without a disk candidate)
    disk_groups: dict = diskplan.NO_GROUPS   # group -> load | wait | recompute
    disk_ckpt: object = None                 # the Checkpoint record those loads complete

    @property
    def outcome(self):
        """hit (the longest checkpoint passed), partial (fell back to a shorter H'), miss."""
        if self.reuse_tokens == 0:
            return "miss"
        return "hit" if self.reuse_tokens == self.candidates[0] else "partial"

    @property
    def reason(self):
        """The first rejection's 'layer:check' (why the longest candidate was refused)."""
        return f"{self.rejections[0].layer}:{self.rejections[0].check}" if self.rejections \
            else ("no-checkpoint" if not self.candidates else "ok")


def _rec_text(kind, rec):
    fields = ", ".join(f"{f}={getattr(rec, f)}" for f in rec.CONTENT)
    return f"{kind} {STATE_NAMES[rec.st]} v{rec.ver} {fields}"


def check_group(mgr, g, needs, H, link=None):
    """(pass, [Rejection], [Read], [DiskRead]) of one group's objects for a resume at H;
    with a DiskLink, objects only on disk are deferred (the group does not pass)."""
    pools, index = mgr.pools, mgr.index
    found, missing, deferred = [], [], []
    for n in needs:
        b = index.get(n.kind, n.group, n.key)
        d = diskplan.probe(link, n, H) if b is None and link is not None else None
        if d is not None:
            deferred.append(d)
        else:
            (missing if b is None else found).append((n, b))
    exact = not any(n.exact for n, _ in missing)      # this group's snapshot at H exists
    if not can_hit_aligned(H, mgr.layout.granule, (g.block_size,), (exact,)):
        return False, [Rejection(H, g.name, 1, "aligned", f"H={H} not on block "
                                 f"{g.block_size} and no exact snapshot")], [], []
    reads = []
    for n, b in found:
        pool = pools[(n.kind, n.group)]
        if not can_hit_abi(pool.abi_of[b], pool.abi):
            return False, [Rejection(H, g.name, 2, "abi", f"{n.kind} stored "
                                     f"{pool.abi_of[b]} != {pool.abi}")], [], []
    if missing:
        n = missing[0][0]
        return False, [Rejection(H, g.name, 3, "missing", f"{n.kind} at {n.at} not cached")], \
            [], []
    cx = mgr.ctx[g.name]
    flags = []
    for n, b in found:
        rec = pools[(n.kind, n.group)].recs[b]
        ok, why = object_ready(n.kind, rec, n.at, cx)
        flags.append(ok)
        if not ok:
            return False, [Rejection(H, g.name, 3, why,
                                     f"{_rec_text(n.kind, rec)} for at={n.at}")], [], []
        reads.append(Read(ObjRef(n.kind, n.group, b), n.at, rec.ver, rec.ep))
    if not can_hit_groups(flags):
        return False, [Rejection(H, g.name, 3, "groups", "intersection")], [], []
    for r in reads:
        if not pools[(r.ref.kind, r.ref.group)].bytes_ok(r.ref.block):
            return False, [Rejection(H, g.name, 4, "bytes", f"{r.ref} misaligned")], [], []
    if deferred:
        states = sorted({d.state for d in deferred})
        return False, [Rejection(H, g.name, 3, "disk", f"{len(deferred)} objects "
                                 f"{'/'.join(states)}, not verified in memory")], [], deferred
    return True, [], reads, []


def branch_length(mgr, keys):
    """Longest prefix whose full compressed blocks are cached in every compressed group."""
    from hybridkv.index import obj_key
    best = None
    gran = mgr.layout.granule
    for g in mgr.layout.groups:
        if not g.compressed:
            continue
        e = g.block_size
        while e <= len(keys) * gran and mgr.index.get(
                "comp", g.name, obj_key(keys[e // gran - 1], g.name, b"chain")) is not None:
            e += g.block_size
        e -= g.block_size
        best = e if best is None else min(best, e)
    return best or 0


def run_funnel(mgr, keys, n_tokens):
    """The HitPlan for a prompt of ``n_tokens`` with chain ``keys`` (at least one token is
    always left to compute, so H <= n_tokens - 1)."""
    gran, index = mgr.layout.granule, mgr.index
    link = getattr(mgr, "disk_link", None)
    limit = min(len(keys), (n_tokens - 1) // gran)
    cands = [(i + 1) * gran for i in range(limit - 1, -1, -1) if keys[i] in index.ckpts]
    if link is not None:
        link.reap(pump=False)          # may run inside allocate: must not take blocks
        cands = sorted(set(cands) | set(diskplan.disk_candidates(mgr, link, keys, limit)),
                       reverse=True)
    group_hits = {g.name: 0 for g in mgr.layout.groups}
    rejections, passes, chosen, disk = [], [], (), None
    for H in cands:
        ck = index.ckpts.get(keys[H // gran - 1])
        needs = ck.needs if ck is not None else index.needs(keys, H)
        oks, reads, dfr, only_disk = [], [], [], True
        for g in mgr.layout.groups:
            ok, rej, rd, df = check_group(mgr, g, [n for n in needs if n.group == g.name], H,
                                          link)
            oks.append(ok)
            rejections += rej
            reads += rd
            dfr += df
            only_disk = only_disk and (ok or bool(df))
            if ok and group_hits[g.name] < H:
                group_hits[g.name] = H
        passed = can_hit_groups(oks)
        passes.append(passed)
        if not passed and only_disk and dfr and disk is None:
            disk = (H, tuple(dfr), Checkpoint(H, keys[H // gran - 1], needs))
        if passed:
            chosen = tuple(reads)
            break
    H = best_hit(cands[:len(passes)], passes)
    extra = ()
    if disk is not None:
        choice, per = diskplan.decide(link, disk[1], H, disk[0])
        extra = (disk[1], disk[0], choice, per, disk[2])
    return HitPlan(H, group_hits, tuple(rejections), tuple(cands), chosen if H else (),
                   branch_length(mgr, keys), n_tokens, *extra)
