"""Measured proposals for hybridkv/cache, applied from outside to one manager instance (a seam,
never a branch in the product). Each is the smallest change that reproduces the behaviour the
report asks the manager to adopt; once the product does it, the prototype is a no-op and goes.

`chain_hits`  (``ModelLayout.full``): a layout whose groups are all ``full`` needs no exact
              object at a block boundary (``objects_at(H)`` is its chain blocks), so no
              checkpoint record is ever written and the funnel, which only considers recorded
              checkpoints, never hits: every lookup is a miss.  Proposal for
              ``cache.funnel.run_funnel``: when ``layout.exact_at(H)`` is empty on block
              boundaries, every boundary the chain runs reach is a candidate (vLLM: every full
              block is a hit).  Here: the index's checkpoint map also answers "yes" for a chain
              key whose comp block is published (the funnel then checks the run as usual).
              Second half, ``cache.index.PrefixIndex.unpublish``: a parent left without
              children is reported dead only when it anchors no checkpoint; in such a layout no
              block anchors one, so evicting a leaf kills its whole chain (the dead tier is
              reclaimed first): the cache degenerates to evicting whole prefixes at once.
              Proposal: a chain block of such a layout is never dead for want of an anchor.
              Here: ``unpublish`` of this index reports no dead objects (it has no exact ones).

`request_hints`  a request's class reaches the eviction policy of every entry it leaves
              cached.  The simulator's policy learned reuse per class of *request* (the output
              length bucket: on both Mooncake traces blocks of requests with >= 128 output
              tokens are almost never reused) as well as per kind; the runtime's Evictor files
              every entry under its object kind only (``EntryMeta.tag = ref.kind``), so
              ``FilteredLRUPolicy`` has little to filter on.  Proposal: ``lookup(..., hint=)``
              (or ``free(request_id, hint=)``, re-filing what the request retained: the engine
              knows the output length when it frees the request), kept on the Request and
              passed by ``Evictor.admit`` as ``EntryMeta.tag = f"{kind}/{hint}"``.  Here: the
              bench sets ``EntryTags.request`` for the whole request, and the pool policies'
              ``admit`` appends it.
`retention_tags`  a retained snapshot's retention reasons (``req.snapshot_tags[P]``: branch,
              repeat, end, every) reach its policy entry, as the simulator's checkpoint classes
              did (branch points are shared prefixes, reused often; end points are reused by
              the next turn or never).  Proposal: ``Snapshots.retain`` / ``release`` pass the
              tags to ``Evictor.admit``, filed as ``EntryMeta.tag = f"{kind}/{tags}"``.  Here:
              this manager's ``snapshots.retain`` / ``release`` set ``EntryTags.retention``
              while they admit.
`touch_recomputed`  a request that recomputes a chain block already cached under the same key
              (past its resume point H: a hit stops at the deepest checkpoint, the chain often
              runs further) re-demanded that block, but only the blocks it reads are accessed:
              the cached copy ages as if unused, and is evicted while the next request needs it
              again -- taking with it the branch checkpoint this request just anchored there.
              The simulator touched every cached block of the prompt.  Proposal: in
              ``ObjectWriter._publish``, when ``index.publish`` refuses a chain block because
              its key is taken, ``Evictor.access`` the block that holds the key.  Here: this
              manager's ``index.publish`` does that on refusal.
"""
from __future__ import annotations

from hybridkv.cache import ObjRef

PROTOTYPES = ("chain_hits", "request_hints", "retention_tags", "touch_recomputed")
NEEDS_TAGS = ("request_hints", "retention_tags")


class UnknownPrototypeError(ValueError):
    """Not one of PROTOTYPES. Carries `value`."""

    def __init__(self, value):
        super().__init__(f"unknown prototype {value!r}; choose from {PROTOTYPES}")
        self.value = value


class _ChainCandidates(dict):
    """``PrefixIndex.ckpts`` that also contains every published chain key of the comp pools."""

    def __init__(self, records: dict, chains: list):
        super().__init__(records)
        self.chains = chains

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or all(key in c for c in self.chains)


class EntryTags:
    """What the product would pass with an admitted entry: the request's class (``request``,
    set by the bench around one request) and the retention reasons of the snapshot being
    admitted (``retention``, set while ``retain`` / ``release`` run).  "" = none."""

    def __init__(self):
        self.request = ""
        self.retention = ""


def tagged(policy_factory, tags: EntryTags):
    """A policy factory whose policies file an admitted entry under ``kind[/retention][/request]``
    (FilteredLRUPolicy and ValuePolicy learn reuse per tag)."""
    def make():
        policy = policy_factory()
        admit = policy.admit

        def admit_tagged(meta, now=0.0):
            extra = [t for t in (tags.retention, tags.request) if t]
            if extra:
                meta = meta._replace(tag="/".join([meta.tag, *extra]))
            admit(meta, now)
        policy.admit = admit_tagged
        return policy
    return make


def output_class(req) -> str:
    """The simulator's request feature: output length bucket (bit_length // 2, capped)."""
    return f"out{min(req.output_length.bit_length() // 2, 6)}"


def needs_chain_hits(layout) -> bool:
    """No group keeps an exact object at its block boundary (all groups are ``full``)."""
    return all(not layout.exact_at(g.block_size) for g in layout.groups)


def _with_retention(fn, tags: EntryTags):
    def call(req, P):
        tags.retention = "+".join(sorted(req.snapshot_tags.get(P, ())))
        try:
            return fn(req, P)
        finally:
            tags.retention = ""
    return call


def _chain_hits(mgr) -> None:
    idx = mgr.index
    idx.ckpts = _ChainCandidates(idx.ckpts, [idx.chain[pk] for pk in mgr.layout.chain_pools()])
    unpublish = idx.unpublish
    idx.unpublish = lambda ref: (unpublish(ref)[0], [])


def _touch_recomputed(mgr) -> None:
    idx, evictor = mgr.index, mgr.evictor
    publish = idx.publish

    def publish_or_touch(ref, key, exact, parent=None):
        if publish(ref, key, exact, parent):
            return True
        if not exact:
            held = idx.chain_block(ref.kind, ref.group, key)
            if held is not None:
                evictor.access(ObjRef(ref.kind, ref.group, held))
        return False
    idx.publish = publish_or_touch


def apply(mgr, names, tags: EntryTags | None = None) -> list:
    """Apply the named prototypes that concern ``mgr`` (the tag prototypes need the ``tags``
    its policies were made with: ``tagged``); returns the names applied."""
    done = []
    for name in names:
        if name not in PROTOTYPES:
            raise UnknownPrototypeError(name)
        if name in NEEDS_TAGS and tags is None:
            raise UnknownPrototypeError(f"{name} without EntryTags")
        if name == "chain_hits" and needs_chain_hits(mgr.layout):
            _chain_hits(mgr)
            done.append(name)
        elif name == "retention_tags":
            snaps = mgr.snapshots
            snaps.retain = _with_retention(snaps.retain, tags)
            snaps.release = _with_retention(snaps.release, tags)
            done.append(name)
        elif name == "touch_recomputed":
            _touch_recomputed(mgr)
            done.append(name)
        elif name == "request_hints":
            done.append(name)            # the bench sets tags.request around each request
    return done
