"""The runtime's hit-validation funnel over the spec predicates, and the HitPlan.

``run_funnel`` works in two passes, each touching only what matched:
  chains     per chain pool (comp / idx of every chained group) walk the chain blocks from the
             start while they are cached and pass layers 2-4 (ABI, readable + covers, bytes);
             the walk stops at the first block that does not (its reason is kept);
  candidates checkpoint records on the prompt's chain, longest first, up to where some chained
             group's chain blocks are all in the index (a record past a block the index lacks
             is unreachable: the chain to it was dropped; it is never tried): a candidate H
             whose every chained group has its chain run reach H's block is checked group by
             group --
             layer 1 spec.funnel.can_hit_aligned (granule; block boundary or exact snapshot),
             layer 2 can_hit_abi, layer 3 readable + the kind's spec ``covers`` (READY_CHECKS)
             then spec.funnel.can_hit_groups over the groups (intersection), layer 4
             can_hit_bytes -- and the first that passes is the resume point (spec best_hit).
Everything longer that was rejected is reported with its layer and reason.  Lookup reads state
only: no pin, no policy access, no I/O.

Disk (a manager with a DiskTier): an object missing from memory whose copy is known on disk
(the tier's in-memory index) is *deferred*: never a read, rejected at layer 3 with check
``disk``; the longest H whose groups fail only by deferral is reported in ``disk`` /
``disk_tokens`` with the cost model's choice; ``CacheManager.prefetch`` starts those loads.
"""
from functools import partial
from itertools import compress, islice, takewhile
from operator import is_not, or_
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from hybridkv.cache.reads import PoolReads, Read, Reads
from hybridkv.layout import CHAIN_KINDS
from spec import compressed, indexer, swa, tail
from spec.common import readable
from spec.funnel import best_hit, can_hit_abi, can_hit_aligned, can_hit_groups

KIND_MODULE = {"comp": compressed, "tail": tail, "swa": swa, "idx": indexer}
STATE_NAMES = ("free", "writing", "ready", "pinned", "loading", "stale")
NO_GROUPS = MappingProxyType({})


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
    check: str          # aligned | abi | missing | readable | covers | bytes | disk
    reason: str


class HitPlan(NamedTuple):
    reuse_tokens: int
    group_hits: dict        # group -> longest H this group alone could resume at
    rejections: tuple       # Rejection, longest H first
    candidates: tuple       # checkpoint positions tried, longest first (the last one passed)
    reads: Reads            # what resuming at reuse_tokens pins and re-checks
    branch: int             # length of the cached compressed chain (Marconi branch point)
    prompt_tokens: int
    disk: tuple = ()        # DiskRead: objects a resume at disk_tokens needs from disk
    disk_tokens: int = 0    # H reachable once those loads verify (0: none)
    disk_choice: str = ""   # load | wait | recompute ("" without a disk candidate)
    disk_groups: dict = NO_GROUPS   # group -> load | wait | recompute
    chain_keys: tuple = ()  # the prompt's chain keys (prefetch re-keys everything from them)

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


class _Check(NamedTuple):
    ok: bool
    read: Read = None
    rejection: tuple = None     # (layer, check, reason) without H / group
    deferred: object = None     # DiskRead


def check_object(pools, ctx, kind, group, b, at, exact, H, disk=None, key=None):
    """Layers 2-4 for one object that must cover ``at`` (b None: not cached in memory)."""
    if b is None:
        d = disk.probe(kind, group, key, exact, at, H) if disk is not None else None
        if d is not None:
            return _Check(False, deferred=d, rejection=(3, "disk", f"{kind} at {at} on disk "
                                                        f"({d.state}), not verified in memory"))
        return _Check(False, rejection=(3, "missing", f"{kind} at {at} not cached"))
    pool = pools[(kind, group)]
    if not pool.abi_ok(can_hit_abi, pool.abi_of[b]):
        return _Check(False, rejection=(2, "abi", f"{kind} stored {pool.abi_of[b]} != {pool.abi}"))
    rec = pool.recs[b]
    ok, why = object_ready(kind, rec, at, ctx)
    if not ok:
        return _Check(False, rejection=(3, why, f"{_rec_text(kind, rec)} for at={at}"))
    if not pool.bytes_ok(b):
        return _Check(False, rejection=(4, "bytes", f"{kind}/{group}#{b} misaligned"))
    return _Check(True, read=Read(pool.refs[b], at, rec.ver, rec.ep, exact))


class _Run(NamedTuple):
    reads: PoolReads    # blocks 0.. that passed
    stop: tuple         # (layer, check, reason) of the first block that did not, or None
    deferred: list      # DiskRead of blocks after the run that are only on disk
    indexed: int        # blocks 0.. the index holds in a row (passing or not)


WALK_RUN_MIN = 8      # a shorter run of found chain blocks is checked block by block
HEAD_RUN = 64         # a run of found blocks past twice this is checked its head first
_is_block = partial(is_not, None)      # an index answer that names a block (ids start at 0)


def walk_chains(layout, index, pools, ctxs, keys, limit, disk=None):
    """(kind, group) -> _Run over the chain blocks ending at or before ``limit`` granules.
    The blocks the index finds in a row from the start are checked as one run when there are
    ``WALK_RUN_MIN`` of them (``_passing_prefix``); the walk goes on block by block from the
    first block that run did not pass (its reason, and what waits on the disk after it)."""
    gran, runs = layout.granule, {}
    for kind, gname in layout.chain_pools():
        g = layout.group(gname)
        bs, cx = g.block_size, ctxs[gname]
        step, n_blocks = bs // gran, limit // (bs // gran)
        reads, stop, deferred, first = PoolReads(kind, gname), None, [], 1
        found = list(takewhile(_is_block, map(index.chain[(kind, gname)].get,
                                              islice(keys, step - 1, n_blocks * step, step))))
        if len(found) >= WALK_RUN_MIN:          # (the index's blocks in a row from the start)
            _passing_prefix(reads, pools[(kind, gname)], cx, found, bs)
            first = len(reads) + 1
        for j in range(first, n_blocks + 1):
            key = keys[j * step - 1]
            c = check_object(pools, cx, kind, gname, index.chain_block(kind, gname, key),
                             j * bs, False, j * bs, disk, key)
            if c.ok and stop is None:
                reads.append(c.read)
                continue
            if stop is None:
                stop = c.rejection
            if c.deferred is None:
                break
            deferred.append(c.deferred)        # keep walking what only waits on the disk
        runs[(kind, gname)] = _Run(reads, stop, deferred, len(found))
    return runs


def reachable_limit(layout, runs, limit):
    """The longest candidate (in granules, at most ``limit``) some group's chains reach in the
    index: a group needs its chain blocks below H, so past its shortest indexed run plus the
    open block it fails whatever else holds; past every group's, so does each candidate.  A
    group with no chain of its own (window layers) bounds nothing, and needs no bound: every
    record hangs from a chain block in each chain pool (``PrefixIndex.anchors_at``), so the
    other groups' runs bound it too.  A layout with no chain at all is not bounded."""
    gran, reach, bounded = layout.granule, 0, False
    for g in layout.groups:
        ends = [(runs[(k, g.name)].indexed + 1) * g.block_size - 1
                for k in CHAIN_KINDS if (k, g.name) in runs]
        if ends:
            bounded = True
            reach = max(reach, min(ends) // gran)
    return min(limit, reach) if bounded else limit


def _passing_prefix(reads, pool, cx, blocks, bs):
    """Append to ``reads`` (PoolReads) the longest prefix of ``blocks`` (chain blocks ending
    at bs, 2 bs, ...) that passes layers 2-4.  A long run is checked a head first
    (``HEAD_RUN``) and the rest only when the whole head passed: the index also finds blocks
    another request is still writing past a short readable prefix, and those need no check
    beyond the first that fails."""
    if len(blocks) > 2 * HEAD_RUN:
        before = len(reads)
        _passing_run(reads, pool, cx, blocks[:HEAD_RUN], bs, 0)
        if len(reads) - before < HEAD_RUN:
            return
        blocks, start = blocks[HEAD_RUN:], HEAD_RUN
    else:
        start = 0
    _passing_run(reads, pool, cx, blocks, bs, start)


def _passing_run(reads, pool, cx, blocks, bs, start):
    """``_passing_prefix`` of ``blocks`` ending at (start + 1) bs, (start + 2) bs, ..., checked
    as one run: the same predicates ``check_object`` calls, each once over the run's records
    as numpy columns (spec.dual's array mode), the ABI per distinct stored value (Pool.abi_ok)."""
    n, abi_of, kind = len(blocks), pool.abi_of, pool.kind
    stored = None if pool.abi_uniform else list(map(abi_of.__getitem__, blocks))
    if stored is None or stored.count(pool.abi) == n:   # all under the pool's ABI (every
        ok = np.full(n, pool.abi_ok(can_hit_abi, pool.abi))    # block of a pool whose ABI
    else:                                                      # never changed is)
        abi_ok = {a: pool.abi_ok(can_hit_abi, a) for a in set(stored)}
        ok = np.fromiter(map(abi_ok.__getitem__, stored), bool, n)
    _, o = pool.recs.gather(blocks)
    at = np.arange((start + 1) * bs, (start + n + 1) * bs, bs, dtype=np.int64)
    mod = KIND_MODULE[kind]
    for _name, fn in READY_CHECKS[kind]:
        ok &= fn(mod, o, at, cx)
    ok &= pool.bytes_ok_run(blocks)
    m = n if ok.all() else int(np.argmin(ok))
    reads.add(blocks[:m], at[:m].tolist(), o.ver[:m].tolist(), o.ep[:m].tolist(), [False] * m)


def check_group(layout, index, pools, ctxs, runs, g, H, key, disk=None):
    """(passed, rejection or None, reads, deferred) of one group for a resume at H; reads:
    (PoolReads, how many of its first) per chain pool, then the exact objects' Read."""
    bs, reads, deferred = g.block_size, [], []
    for kind in ("comp", "idx"):
        if kind not in g.kinds:
            continue
        run, need = runs[(kind, g.name)], H // bs
        if len(run.reads) < need:
            more = run.deferred[:need - len(run.reads)]
            if len(run.reads) + len(more) < need or run.stop[1] != "disk":
                return False, Rejection(H, g.name, *run.stop), [], []
            deferred += more
        reads.append((run.reads, need))
    exact_missing, found = False, []
    for spec in layout.exact_at(H):
        if spec.group != g.name:
            continue
        b = index.exact_block(spec.kind, g.name, key)
        exact_missing |= b is None and (disk is None or disk.probe(
            spec.kind, g.name, key, True, H, H) is None)
        found.append((spec, b))
    if not can_hit_aligned(H, layout.granule, (bs,), (not exact_missing,)):
        return False, Rejection(H, g.name, 1, "aligned", f"H={H} not on block {bs} and no "
                                "exact snapshot"), [], []
    for spec, b in found:
        c = check_object(pools, ctxs[g.name], spec.kind, g.name, b, H, True, H, disk, key)
        if c.deferred is not None:
            deferred.append(c.deferred)
        elif not c.ok:
            return False, Rejection(H, g.name, *c.rejection), [], []
        else:
            reads.append(c.read)
    if deferred:
        return False, Rejection(H, g.name, 3, "disk", f"{len(deferred)} objects on disk, not "
                                "verified in memory"), [], deferred
    return True, None, reads, []


def _plan_reads(parts):
    """The plan's Reads from check_group's parts: chain prefixes (PoolReads, n) and Reads."""
    out = Reads()
    for part in parts:
        if isinstance(part, Read):
            r = part.ref
            out.add(r.kind, r.group, [r.block], [part.at], [part.ver], [part.ep], [part.exact])
        else:
            out.add_run(*part)
    return out


def branch_length(layout, runs):
    """Longest prefix whose full compressed blocks are cached in every compressed group."""
    lens = [len(runs[(k, g)].reads) * layout.group(g).block_size
            for k, g in runs if k == "comp"]
    return min(lens) if lens else 0


def candidate_positions(keys, limit, gran, ckpts, on_disk, ends=None):
    """Positions i * gran (i <= limit), longest first, whose chain key has a checkpoint record
    (in ``ckpts``, or in ``ends``: the chain map whose blocks record their ends,
    PrefixIndex.ends) or whose granule ``on_disk`` names, as an iterator: the membership scan
    runs at C speed (compress over ``__contains__``) and only as far as the caller takes
    positions; the disk's few granules merged in."""
    upto = keys[:limit]
    flags = map(ckpts.__contains__, reversed(upto))
    if ends is not None:
        flags = map(or_, flags, map(ends.__contains__, reversed(upto)))
    recorded = compress(range(limit, 0, -1), flags)
    if not on_disk:
        return map(gran.__mul__, recorded)
    extra = [i for i in on_disk if 1 <= i <= limit]
    return iter([i * gran for i in sorted(set(recorded).union(extra), reverse=True)])


def run_funnel(layout, index, pools, ctxs, keys, n_tokens, disk=None):
    """The HitPlan for a prompt of ``n_tokens`` with chain ``keys`` (at least one token is
    always left to compute, so H <= n_tokens - 1)."""
    gran = layout.granule
    limit = min(len(keys), (n_tokens - 1) // gran)
    runs = walk_chains(layout, index, pools, ctxs, keys, limit, disk)
    ckpts = index.ckpts
    on_disk = disk.candidates(keys, limit) if disk is not None else frozenset()
    cands = []                 # the positions tried, longest first, up to the first that passes
    group_hits = {g.name: 0 for g in layout.groups}
    rejections, passes, chosen, disk_at = [], [], [], None
    reach = limit if disk is not None else reachable_limit(layout, runs, limit)
    for H in candidate_positions(keys, reach, gran, ckpts, on_disk, index.ends):
        cands.append(H)
        key = keys[H // gran - 1]
        oks, reads, deferred, only_disk = [], [], [], True
        for g in layout.groups:
            ok, rej, rd, df = check_group(layout, index, pools, ctxs, runs, g, H, key, disk)
            oks.append(ok)
            reads += rd
            deferred += df
            if rej is not None:
                rejections.append(rej)
            only_disk = only_disk and (ok or bool(df))
            if ok and group_hits[g.name] < H:
                group_hits[g.name] = H
        passed = can_hit_groups(oks)
        passes.append(passed)
        if not passed and only_disk and deferred and disk_at is None:
            disk_at = (H, tuple(deferred))
        if passed:
            chosen = reads
            break
    H = best_hit(cands, passes)
    extra = ((), 0, "", NO_GROUPS)
    if disk_at is not None:
        choice, per = disk.decide(disk_at[1], H, disk_at[0])
        extra = (disk_at[1], disk_at[0], choice, per)
    return HitPlan(H, group_hits, tuple(rejections), tuple(cands), _plan_reads(chosen if H else ()),
                   branch_length(layout, runs), n_tokens, *extra, tuple(keys))
