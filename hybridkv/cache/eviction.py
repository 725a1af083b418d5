"""Eviction per (kind, group) pool, each pool with its own policy instance (never one global
LRU across kinds): which cached blocks may go, in which order, and taking one out.

Order within a pool: first objects no lookup can reach any more (``dead``: the exact objects
and leaf anchors of a checkpoint whose chain or snapshot went; PrefixIndex.unpublish reports
them), then the policy's choice among *leaves* -- cached blocks without cached children in this
pool -- so a chain loses its deepest block first and a prefix is never broken in the middle.

A block is ``cached`` when it is admitted to the policy, READY (or STALE) and unpinned.  A
cached block can still have a *live* descendant: a request that recomputed a prefix another
request published meanwhile hangs its next chain blocks off the other's (cached) block.  Such a
block is ``blocked``: eviction (leaves first) never reaches it while that descendant lives, so
admission counts per pool only what eviction can take, ``n_free + cached - blocked``
(hybridkv.cache.liveness.Liveness keeps live and blocked).
"""
import contextlib
from bisect import bisect_left
from itertools import groupby, repeat
from operator import mul

import numpy as np

from hybridkv.cache.arena_pool import PageCountedSet
from hybridkv.cache.liveness import Liveness
from hybridkv.cache.request import CacheEvent
from hybridkv.errors import AdmissionRefused
from hybridkv.policy import EntryMeta, count_unkept
from spec.common import PINNED, READY, STALE

CACHED_STATES = (READY, STALE)
CACHED_SET = frozenset(CACHED_STATES)
PLACE_RUN_MIN = 2       # a single block is placed alone
FLOPS_ARRAY_MIN = 16    # a chain's FLOPs as a numpy column from this many blocks on


class Evictor:
    def __init__(self, pools, index, policy_factory, metrics, on_evict=None):
        self.pools, self.index, self.metrics = pools, index, metrics
        self.policies = {pk: policy_factory() for pk in pools}
        for pk, policy in self.policies.items():        # keys are block ids: entries as columns
            if hasattr(policy, "key_space"):
                policy.key_space(pools[pk].n)
        self.admitted = {pk: set() for pk in pools}     # cache entries (in the policy)
        self.cached = {pk: set() for pk in pools}       # admitted, READY/STALE, unpinned
        self.eligible = {pk: set() for pk in pools}     # cached leaves, offered to the policy
        self.dead = {pk: {} for pk in pools}            # unreachable (ordered), reclaimed first
        for pk, pool in pools.items():                  # k-page blocks: their pages counted
            if pool.pages_per_block > 1:
                self.cached[pk] = PageCountedSet(pool.pages_held_by)
        self.liveness = Liveness(pools, index, self.cached)   # live / blocked blocks
        self.on_evict = on_evict      # spill hook: each victim, in order, before it goes
        self.events = None                              # CacheEvent list (manager's feed)
        self.clock = 0
        self.runs = True          # evict runs (no on_evict), admit chains (False: block by block)

    # -- what is cached --------------------------------------------------------------------
    def admit(self, ref, at, exact, tags=()):
        """A published block becomes a cache entry (evictable once unpinned and a leaf).  It
        enters the policy now, stamped with this use: a chain block that becomes a leaf only
        when its child goes keeps the recency of its last use (never a fresh one).  ``tags``
        (why a snapshot was retained, the class of the request that leaves it) file it under
        ``kind/tag/...``: the policy learns reuse per class."""
        pk, b = (ref.kind, ref.group), ref.block
        if b not in self.admitted[pk]:
            self.admitted[pk].add(b)
            pool = self.pools[pk]
            tag = "/".join([ref.kind, *(t for t in tags if t)])
            self.policies[pk].admit(EntryMeta(b, "checkpoint" if exact else "block",
                                              pool.block_nbytes, float(at * pool.n_layers),
                                              tag), self.clock)
        self.refresh(ref)

    def admit_reads(self, runs, tags=()):
        """``admit`` of each read block that is unpinned and published: what a free leaves
        cached.  ``runs``: pool key -> (blocks, positions, exact flags) of the request's
        reads, in order.  Admitting a block reads and writes only its own pool's state, so
        per pool the sets and the policy block by block, then liveness once over the blocks
        (``Liveness.settle_chain``: a chain given tips first is walked once); the state
        ``admit`` + ``refresh`` block by block leaves (what ``runs`` False does: the
        reference)."""
        if not self.runs:
            for pk, (blocks, at, exact) in runs.items():
                pool = self.pools[pk]
                for b, a, e in zip(blocks, at, exact):
                    if self.index.published(*pk, b) and pool.recs.state(b) != PINNED:
                        self.admit(pool.refs[b], a, e, tags)
            return
        for pk, (pool_blocks, at, exact) in runs.items():
            pool, policy = self.pools[pk], self.policies[pk]
            admitted, ents = self.admitted[pk], self.index.entries[pk]
            tag = "/".join([pk[0], *(t for t in tags if t)])
            sts = pool.recs.values(pool_blocks, "st")
            if PINNED in sts:
                pool_blocks, at, exact, sts = self._unpinned_head(pool_blocks, at, exact, sts)
                if not pool_blocks:
                    continue
            chain = PINNED not in sts and self.liveness.chain_of(pk, pool_blocks)
            if chain or PINNED not in sts and ents.keys() >= set(pool_blocks):  # all change
                keep, changed, states = range(len(pool_blocks)), pool_blocks, sts
            else:
                keep = [i for i, (b, st) in enumerate(zip(pool_blocks, sts))
                        if st != PINNED and b in ents]
                changed, states = [pool_blocks[i] for i in keep], [sts[i] for i in keep]
            freed = CACHED_SET.issuperset(states)               # (each was PINNED: live)
            k = self._fresh_prefix(admitted, pool_blocks) if chain else None
            uses_seq = getattr(policy, "admit_uses_seq", True)
            if uses_seq and k is not None:
                self._admit_seq_chain(pk, pool_blocks, at, exact, sts, k, tag)
            elif uses_seq:                                  # admit, place, block by block
                for i in keep:
                    b = pool_blocks[i]
                    if b not in admitted:
                        admitted.add(b)
                        policy.admit(EntryMeta(b, "checkpoint" if exact[i] else "block",
                                               pool.block_nbytes,
                                               float(at[i] * pool.n_layers), tag), self.clock)
                    self._place_run(pk, (b,), (sts[i],), fresh=True)
            else:                                           # admissions first, at once
                if k is not None:           # a chain's admitted blocks: its top (the hit)
                    pool_blocks, at, exact = pool_blocks[:k], at[:k], exact[:k]
                elif changed is not pool_blocks or not admitted.isdisjoint(pool_blocks):
                    fresh = [i for i in keep if pool_blocks[i] not in admitted]
                    pool_blocks, at, exact = ([col[i] for i in fresh]
                                              for col in (pool_blocks, at, exact))
                admitted.update(pool_blocks)                # else none admitted yet: all
                self._admit_chains(pk, pool_blocks, at, exact, tag)
                self._place_run(pk, changed, states, chain, fresh=True, all_cached=freed)
            self.liveness.settle_chain(pk, changed, chain, freed=freed)

    @staticmethod
    def _unpinned_head(blocks, at, exact, sts):
        """``admit_reads``' columns of one pool cut to the blocks before the first PINNED one
        when every block from there on is PINNED (a hit's shared root side, still read by
        another request, given last): the block-by-block calls skip exactly those, so the
        rest is the whole run (a chain, tips first, admitted at once).  Otherwise unchanged."""
        j = sts.index(PINNED)
        if sts.count(PINNED) != len(sts) - j:
            return blocks, at, exact, sts
        return blocks[:j], at[:j], exact[:j], sts[:j]

    def _admit_seq_chain(self, pk, blocks, at, exact, sts, k, tag):
        """``admit_reads`` of a chain given tips first, its first k blocks new, for a policy
        whose priorities are sequence numbers (``admit_uses_seq``): the block-by-block calls
        admit the tip, offer it while a cached leaf, then admit the others -- none a leaf
        (each has the one before as a child), so none offered -- and that order, so the
        numbers each call takes, is kept: the tip alone, then the rest as one chain."""
        admitted = self.admitted[pk]
        if k:
            admitted.add(blocks[0])
            self._admit_chains(pk, blocks[:1], at[:1], exact[:1], tag)
        self._place_run(pk, blocks[:1], sts[:1], fresh=True)
        admitted.update(blocks[1:k])
        self._admit_chains(pk, blocks[1:k], at[1:k], exact[1:k], tag)
        self._place_run(pk, blocks[1:], sts[1:], True, fresh=True)

    @staticmethod
    def _fresh_prefix(admitted, blocks):
        """k where ``blocks[:k]`` are not in ``admitted`` and ``blocks[k:]`` all are (a chain
        given deepest first whose top the request reused); None when they are not split so."""
        k = bisect_left(blocks, True, key=admitted.__contains__)   # where such a split is
        return k if admitted.isdisjoint(blocks[:k]) and admitted.issuperset(blocks[k:]) \
            else None                                  # (none: the search found some k)

    def _admit_chains(self, pk, blocks, at, exact, tag):
        """New policy entries for ``blocks`` (not admitted yet; their positions and exact
        flags beside them), in order: one ``admit_chain`` per stretch of chain blocks or
        exact objects."""
        pool, policy = self.pools[pk], self.policies[pk]
        stretches = [(False, range(len(blocks)))] if True not in exact else \
            groupby(range(len(blocks)), exact.__getitem__)
        for e, stretch in stretches:
            stretch = list(stretch)
            if len(stretch) < len(blocks):
                run_blocks, run_at = [blocks[i] for i in stretch], [at[i] for i in stretch]
            else:
                run_blocks, run_at = blocks, at
            policy.admit_chain(run_blocks, "checkpoint" if e else "block", pool.block_nbytes,
                               np.asarray(run_at, dtype=np.float64) * pool.n_layers
                               if len(run_at) >= FLOPS_ARRAY_MIN else
                               list(map(float, map(mul, run_at, repeat(pool.n_layers)))),
                               tag, self.clock)

    def _place_run(self, pk, blocks, states, chain=False, fresh=False, all_cached=None):
        """Each of ``blocks`` (published, with its state), in order, in or out of ``cached``
        and offered to the policy while a cached leaf (``refresh`` with the state in hand).
        ``chain``: ``blocks`` are a chain given deepest first (Liveness.chain_of), so only the
        first can be a leaf.  ``fresh``: none is cached or eligible yet (each was PINNED
        before this call's caller unpinned it: a free's reads).  ``all_cached``: whether every
        one of ``states`` is a cached state, when the caller knows (None: found here)."""
        cached, eligible, policy = self.cached[pk], self.eligible[pk], self.policies[pk]
        ents = self.index.entries[pk]
        if all_cached is None:
            all_cached = CACHED_SET.issuperset(states)
        if len(blocks) >= PLACE_RUN_MIN and all_cached and \
                (fresh or eligible.isdisjoint(blocks)):   # newly cached (a free): leaves join
            cached.update(blocks)
            leaves = [b for b in (blocks[:1] if chain else blocks) if not ents[b].children]
            for b in leaves:
                policy.eligible(b)
            eligible.update(leaves)
            self.pools[pk].touch_run(blocks)
            return
        for b, st in zip(blocks, states):
            if st in CACHED_STATES:
                cached.add(b)
                leaf = not ents[b].children
            else:
                cached.discard(b)
                leaf = False
            if leaf and b not in eligible:
                policy.eligible(b)
                eligible.add(b)
            elif not leaf and b in eligible:
                policy.ineligible(b)
                eligible.discard(b)
        self.pools[pk].touch_run(blocks)

    def entered(self, ref):
        """Block ``ref`` was just published (unfinished, so live): its parent gains a live
        child and may stop being a leaf."""
        self.liveness.settle((ref.kind, ref.group), ref.block)
        parent = self.index.parent(ref)
        if parent is not None:
            self.refresh(parent)

    def entered_run(self, ref, blocks):
        """``entered`` for chain blocks just published in a row, ``ref`` the first of them,
        each block in ``blocks`` the next one's child: the first may flip its parent, each
        later one is a live child of a fresh (live, uncached) block, so nothing travels."""
        self.entered(ref)
        pk = (ref.kind, ref.group)
        self.liveness.entered_run(pk, ref.block, blocks)
        self.pools[pk].touch_run([ref.block, *blocks])

    def _ref(self, pk, b):
        """Block b of pool ``pk`` as the pool's ObjRef."""
        return self.pools[pk].refs[b]

    def refresh(self, ref):
        """Re-derive the block's place (after a pin, unpin, or a change of its children)."""
        pk, b = (ref.kind, ref.group), ref.block
        pool = self.pools[pk]
        cached = b in self.admitted[pk] and pool.recs.state(b) in CACHED_STATES
        (self.cached[pk].add if cached else self.cached[pk].discard)(b)
        leaf = cached and self.index.children(ref) == 0
        if leaf and b not in self.eligible[pk]:
            self.policies[pk].eligible(b)
            self.eligible[pk].add(b)
        elif not leaf and b in self.eligible[pk]:
            self.policies[pk].ineligible(b)
            self.eligible[pk].discard(b)
        pool.touch(b)
        self.liveness.settle(pk, b)

    def takeable(self, ref):
        """Eviction can take this block (now, or once its cached descendants went)."""
        return self.liveness.takeable((ref.kind, ref.group), ref.block)

    def took_hit(self, runs):
        """``refresh`` then ``access`` of each block of ``runs`` ((pool key, blocks) per pool,
        in order: a hit's distinct blocks, every one PINNED now), in order: per pool, out of
        the cached and eligible sets at once (``_place_run``), liveness settled in order
        (``settle_chain``), then the policy's accesses in order under the clock each had in
        the block-by-block sequence (a pinned block is never eligible, and an access reads no
        set nor liveness, so the state ends as the block-by-block calls leave it).  Any block
        not PINNED: the block-by-block calls."""
        if any(st != PINNED for pk, blocks in runs
               for st in self.pools[pk].recs.values(blocks, "st")):
            for pk, blocks in runs:
                for ref in map(self.pools[pk].refs.__getitem__, blocks):
                    self.refresh(ref)
                    self.access(ref)
            return
        clock = self.clock
        for pk, blocks in runs:
            self._place_run(pk, blocks, [PINNED] * len(blocks))
            self.liveness.settle_chain(pk, blocks)
            admitted, policy = self.admitted[pk], self.policies[pk]
            for c, b in enumerate(blocks, clock + 1):
                if b in admitted:
                    policy.access(b, c)
            clock += len(blocks)
        self.clock = clock

    def access(self, ref):
        """A request used the block (a hit)."""
        self.clock += 1
        if ref.block in self.admitted[(ref.kind, ref.group)]:
            self.policies[(ref.kind, ref.group)].access(ref.block, self.clock)

    def mark_dead(self, refs):
        for ref in refs:
            pk = (ref.kind, ref.group)
            self.dead[pk][ref.block] = None
            self.pools[pk].touch(ref.block)

    def unkept(self, pk, n):
        """n blocks of pool ``pk`` were written that the cache does not keep (a freed request's
        unsealed chain blocks: its partial last block): its policy counts them among the
        blocks written (``policy.count_unkept``)."""
        count_unkept(self.policies[pk], n)

    def forget(self, ref, evicted=True):
        """The block left the cache (dropped): out of the policy and every set."""
        pk, b = (ref.kind, ref.group), ref.block
        self.dead[pk].pop(b, None)
        self.cached[pk].discard(b)
        if b in self.eligible[pk]:
            self.eligible[pk].discard(b)
        if b in self.admitted[pk]:
            self.admitted[pk].discard(b)
            self.policies[pk].remove(b, evicted)
        self.pools[pk].touch(b)

    @contextlib.contextmanager
    def holding(self, reads):
        """Within the block, the cached blocks ``reads`` name (Read records) are neither
        counted as available nor evicted: a prefetch keeps its plan's memory part."""
        held = [r.ref for r in reads if r.ref.block in self.cached[(r.ref.kind, r.ref.group)]]
        for ref in held:
            pk = (ref.kind, ref.group)
            self.cached[pk].discard(ref.block)
            if ref.block in self.eligible[pk]:
                self.eligible[pk].discard(ref.block)
                self.policies[pk].ineligible(ref.block)
            self.liveness.settle(pk, ref.block)
        try:
            yield
        finally:
            for ref in held:
                self.refresh(ref)

    def available(self, pk):
        """Blocks pool ``pk`` can supply: free now, or cached and not blocked (eviction takes
        every one of them, leaves first)."""
        return self.pools[pk].n_free + len(self.cached[pk]) - len(self.liveness.blocked[pk])

    def takeable_pages(self, pk):
        """Arena pages the cached blocks of pool ``pk`` eviction can take hold (a pool of
        k-page blocks: their page counts; else one each)."""
        cached, blocked = self.cached[pk], self.liveness.blocked[pk]
        if isinstance(cached, PageCountedSet):
            return cached.pages - blocked.pages
        return len(cached) - len(blocked)

    # -- taking blocks back -----------------------------------------------------------------
    def victim(self, pk):
        """The next block to evict from pool ``pk``: a dead cached one, else the policy's
        choice among leaves; None when nothing can go."""
        dead = self.dead[pk]
        while dead:
            b = next(iter(dead))
            ref = self._ref(pk, b)
            if b in self.cached[pk] and not self.index.reachable(ref):
                return b
            del dead[b]                       # pinned again, gone, or reachable again
        return self.policies[pk].victim()

    def drop(self, ref, event="evict"):
        """Take a block out: fire ``event`` (to FREE; a stale indexer block by drop_stale),
        unpublish it, forget it; parents left without children are re-offered as leaves and
        what only it made reachable is marked dead.  A refused event changes nothing.  A
        block never published (a request's working object) has no index entry, event,
        liveness (published blocks only) nor cache entry (admitted ones are published): the
        table event alone."""
        pk, b = (ref.kind, ref.group), ref.block
        pool = self.pools[pk]
        event = _event(pool, b, event)
        pool.fire(b, event)
        if b not in self.index.entries[pk]:
            return
        filed = self.index.key_of(*ref) if self.events is not None else None
        if filed is not None:
            self.events.append(CacheEvent(False, ref.kind, ref.group, filed[0], None, None,
                                          filed[1], None))
        self._unfile(ref, event)

    def _unfile(self, ref, event):
        """What ``drop`` does after the table event took published block ``ref``: out of the
        index, the policy and the sets, its liveness out of its parent's count; parents left
        without children re-offered as leaves, what only it made reachable marked dead."""
        pk = (ref.kind, ref.group)
        parent = self.index.parent(ref)
        leaves, dead = self.index.unpublish(ref)
        self.forget(ref, event != "reject")
        self.liveness.unlink(pk, ref.block, parent)
        for p in leaves:
            self.refresh(p)
        self.mark_dead(dead)

    def discard_run(self, pk, blocks, event):
        """``drop`` (by ``event``) of each of ``blocks`` of pool ``pk``, in order: a request's
        working blocks, never published nor admitted (a window's pages it slid past), so
        nothing but the table, the sets and the liveness sees them: the table once over the
        run (Pool.fire_run).  Any other block, or ``runs`` off, goes through ``drop`` one by
        one."""
        pool, ents, admitted = self.pools[pk], self.index.entries[pk], self.admitted[pk]
        if not self.runs or not (ents.keys().isdisjoint(blocks) and admitted.isdisjoint(blocks)
                                 and STALE not in pool.recs.values(blocks, "st")):
            for b in blocks:
                self.drop(self._ref(pk, b), event)
            return
        pool.fire_run(blocks, event)
        dead = self.dead[pk]
        if dead:
            for b in blocks:
                dead.pop(b, None)
        self.cached[pk].difference_update(blocks)   # unpublished: no liveness (Liveness
        self.eligible[pk].difference_update(blocks)  # holds published blocks)
        pool.touch_run(blocks)

    def make_room(self, pk, k):
        """Evict this pool's victims (never another kind's) until k blocks are free
        (``evict_run`` after run)."""
        pool = self.pools[pk]
        while pool.n_free < k:
            if not self.evict_run(pk, k - pool.n_free):
                raise AdmissionRefused("pool exhausted", {f"{pk[0]}/{pk[1]}": (k, pool.n_free)})

    def evict_run(self, pk, n, keep=None):
        """Evict pool ``pk``'s victim, each first offered to ``on_evict`` (a disk tier spills
        it); returns how many blocks went (0: no victim).  Without that hook a policy victim
        goes with up to n - 1 ancestors it leaves as the next victims (``_run``) as one run,
        or else with the victims that follow it quietly (``_sweep``); with it, block by
        block: each spill is a copy and a write, and the tier's in-flight budget sees them
        spaced as the drops space them.  ``keep(prev, p, dead, i)`` may end the run before
        ancestor p (the one-block-at-a-time caller would choose otherwise); with ``keep`` (an
        arena of several pools, which ranks the giver anew for each page) no sweep."""
        b = self.victim(pk)
        if b is None:
            return 0
        run, event = self._run(pk, b, n, keep)
        if len(run) == 1 and keep is None:
            run = self._sweep(pk, b, n)
            if len(run) > 1:
                self._drop_sweep(pk, run)
        elif len(run) > 1:
            self._drop_run(pk, run, event)
        if len(run) == 1:
            run = [self._ref(pk, b)]
            if self.on_evict is not None:
                self.on_evict(run[0])
            self.drop(run[0])
        self.metrics.evicted(pk[0], len(run))
        return len(run)

    def _run(self, pk, b, n, keep=None):
        """Up to n blocks that the block-by-block loop of make_room would evict one after
        another from victim b on, with their event: b, then each ancestor left a leaf by the
        one before (PrefixIndex.lone_ancestors) while it is cached and not blocked, leaves by
        the same event, is accepted by the table, ``keep`` keeps it (when given: called with
        the block before it, it, whether it is left dead and how many go before it) and is
        the victim next.  The victim next: for a policy victim (no dead block waiting) the
        ones left dead, else the policy's choice (``run_length``); for b the only dead block
        waiting, the ancestors left dead (each the only one waiting in its turn)."""
        dead_now = self.dead[pk]
        if not self.runs or n < 2 or self.on_evict is not None or \
                (dead_now and (len(dead_now) != 1 or b not in dead_now)):
            return [b], None
        pool, cached, blocked = self.pools[pk], self.cached[pk], self.liveness.blocked[pk]
        event = _event(pool, b)
        ups, deads = self.index.lone_ancestors(pk[0], pk[1], b, n - 1)
        if keep is None and not dead_now and cached.issuperset(ups) and blocked.isdisjoint(ups):
            run = [b, *ups]                   # every one goes: no per-block test
        else:
            run = [b]
            for p, dead in zip(ups, deads):
                if p not in cached or p in blocked or (dead_now and not dead) \
                        or (keep is not None and not keep(run[-1], p, dead, len(run))):
                    break
                run.append(p)
        forced = {p for p, dead in zip(run[1:], deads) if dead} if True in deads else ()
        if len(run) > 1:                      # up to the first block another event takes
            sts = pool.recs.values(run, "st")
            if sts[0] != STALE:
                run = run[:sts.index(STALE)] if STALE in sts else run
            else:
                run = run[:next((i for i, st in enumerate(sts) if st != STALE), len(sts))]
            run = run[:pool.accepted(run, event)]
            if not dead_now:
                run = run[:self.policies[pk].run_length(run, forced)]
        return run, event

    def _sweep(self, pk, b, n):
        """Up to n blocks that the block-by-block loop of make_room would evict one after
        another from victim b on, when ``_run`` found no chain run: the dead blocks waiting,
        in order, while each is still a victim (cached and unreachable: a drop never makes a
        block reachable or cached again, and what it reports dead waits behind them); or,
        with none waiting, b and the policy's next victims (``victims``) while each one before
        goes quietly (PrefixIndex.drops_quietly: it leaves no leaf and nothing dead in this
        pool, so the next victim is the policy's next).  Each goes by the event b goes by and
        is accepted by the table.  [b] when there is no such run; without ``runs`` or with an
        on_evict hook eviction is block by block."""
        if not self.runs or n < 2 or self.on_evict is not None:
            return [b]
        pool, waiting = self.pools[pk], self.dead[pk]
        event = _event(pool, b)
        if waiting:
            cached, refs, reachable, run = self.cached[pk], pool.refs, self.index.reachable, []
            for d in waiting:
                if len(run) == n or d not in cached or reachable(refs[d]) or \
                        _event(pool, d) != event:
                    break
                run.append(d)
        else:
            victims = getattr(self.policies[pk], "victims", None)
            if victims is None:
                return [b]
            gone, quiet = {}, self.index.drops_quietly
            run = victims(n, lambda v: quiet(pk[0], pk[1], v, gone) and
                          _event(pool, v) == event)
        if run[:1] != [b]:
            return [b]
        return run[:max(1, pool.accepted(run, event))]  # (one by another event: refused)

    def _drop_sweep(self, pk, run):
        """``drop`` of each block of a run from ``_sweep``, in order: the table once over the
        run (Pool.fire_run), then block by block what ``drop`` does after its table event
        (``_unfile``: nothing there reads the records the run changed)."""
        kind, group = pk
        pool = self.pools[pk]
        event = _event(pool, run[0])
        pool.fire_run(run, event)
        if self.events is not None:
            self.events.extend(CacheEvent.removed_run(kind, group,
                                                      *self.index.keys_of_run(kind, group, run)))
        for b in run:
            self._unfile(pool.refs[b], event)

    def _drop_run(self, pk, run, event):
        """``drop`` of each block of a run from ``_run``, in order: the table once over the
        run (Pool.fire_run), the index once (unpublish_run), the policy once (remove_run), the
        sets block by block, the liveness once and the top block's parent re-offered once."""
        kind, group = pk
        pool = self.pools[pk]
        pool.fire_run(run, event)
        if self.events is not None:
            self.events.extend(CacheEvent.removed_run(kind, group,
                                                      *self.index.keys_of_run(kind, group, run)))
        parent = self.index.parent(self._ref(pk, run[-1]))
        leaves, dead = self.index.unpublish_run(kind, group, run)
        self.policies[pk].remove_run(run)
        waiting, cached = self.dead[pk], self.cached[pk]
        if waiting:
            for b in run:
                waiting.pop(b, None)
        if isinstance(cached, PageCountedSet):
            for b in run:
                cached.discard(b)
        else:
            cached.difference_update(run)
        self.eligible[pk].difference_update(run)
        self.admitted[pk].difference_update(run)
        pool.touch_run(run)
        self.liveness.unlink_run(pk, run, parent)
        for p in leaves:
            self.refresh(p)
        self.mark_dead(dead)

    def check(self):
        """Problems (empty list = sound): every set holds only what its definition says."""
        bad = []
        for pk, pool in self.pools.items():
            for b in self.cached[pk]:
                if b not in self.admitted[pk] or pool.recs.state(b) not in CACHED_STATES:
                    bad.append(("cached", pk, b, pool.recs.state(b)))
            for b in self.eligible[pk]:
                if b not in self.cached[pk] or self.index.children(self._ref(pk, b)):
                    bad.append(("eligible", pk, b))
            for b in self.admitted[pk]:
                if not self.index.published(pk[0], pk[1], b):
                    bad.append(("admitted-unpublished", pk, b))
            if len(self.policies[pk]) != len(self.admitted[pk]):     # one entry each
                bad.append(("policy-entries", pk, len(self.policies[pk]),
                            len(self.admitted[pk])))
            bad += self.liveness.check(pk)
            for name, blocks in (("cached", self.cached[pk]),
                                 ("blocked", self.liveness.blocked[pk])):
                if isinstance(blocks, PageCountedSet) and blocks.pages != sum(
                        pool.pages_held_by(b) for b in blocks):
                    bad.append((name + "-pages", pk, blocks.pages))
        return bad


def _event(pool, b, event="evict"):
    """The event that takes block b back: ``event``, but a stale indexer block is dropped."""
    return "drop_stale" if pool.recs.state(b) == STALE else event
