"""When the adapter commits to hybridkv: vLLM's computed tokens -> ``CacheManager.commit`` calls.

vLLM caches a step's blocks when it allocates them, before the step runs; hybridkv seals and
publishes what a commit covers, and captures a snapshot when a commit ends exactly on one of
the allocation's checkpoints.  Per request (``Tracked``):

  target       commits follow the positions vLLM counts as cached (allocate_slots: computed +
               new, capped at the known tokens; cache_blocks; free: the computed ones), never
               past the allocation nor the known token ids (speculative tokens wait, and a
               block's last position waits for vLLM's hash of the block: token_ids)
  checkpoints  a commit is split at every checkpoint that has snapshots (each is captured),
               except one whose objects are all windows: hybridkv captures it as the commit
               passes (``Snapshots.passable``), so a full + SWA chunk commits once, not once
               per block.  One past the positions scheduled in earlier steps
               (``num_computed_tokens``, or the hit) is not captured yet: its copy runs before
               this step's forward and would read rows the step has not written.  The commit
               stops just before it and goes on at the next call; ``catch_up`` (each lookup)
               moves such requests on
  settled      windows slide only past positions whose queries have run
               (``num_computed_tokens - num_in_flight_tokens``): an in-flight step still reads
               the window below the optimistic count; a layout without a window has nothing
               to slide, so a slide alone is no call (each commit still passes its settled
               positions)
  whole blocks on a layout with neither a window nor a snapshot object (full attention), a
               commit inside a block changes nothing but hybridkv's count of computed
               positions: nothing is sealed, published, captured or slid before the block's
               end.  There a step's commit waits for the block end (``block_tokens``: every
               group's block ends are its multiples), so a decode commits once per block, as
               vLLM caches a block once it is full; a release (``force``) commits the rest
"""
from hybridkv.integrations.vllm.translate import known_positions, token_ids


def capturable(track):
    """Positions computed by steps scheduled before the current one (or hit)."""
    return max(track.hit, track.request.num_computed_tokens)


def settled_basis(track):
    """Positions whose queries have run (the hit's are cached)."""
    request = track.request
    return max(track.hit, request.num_computed_tokens -
               getattr(request, "num_in_flight_tokens", 0))


class Commits:
    """Moves each tracked request's hybridkv commits along (``advance``); owns the set of
    requests whose commit stopped before a checkpoint not capturable yet."""

    def __init__(self, copies, layout):
        self.copies = copies              # WorkerCopies: the captures' copies go there
        self.layout = layout              # ModelLayout: which points are windows only
        self.slides = any(g.window for g in layout.groups)   # a slide alone matters
        # an objectless layout (full attention): commits wait for whole blocks
        self.block_tokens = layout.granule if layout.objectless else 1
        self.deferred = {}                # request id -> Tracked stopped before a checkpoint

    def add_points(self, track, checkpoints):
        """An allocation's checkpoints that have snapshots join the request's."""
        new = [P for P in checkpoints if self.layout.exact_kinds(P) and P > track.committed]
        if new:
            track.points = sorted(set(track.points).union(new))

    def advance(self, cache, track, settled=None, force=False):
        """Commit toward the target as far as the rules allow; slide the windows to the
        settled basis (``settled``, or the request's).  ``force``: past the last whole block
        too (a release)."""
        request, points = track.request, track.points
        end = track.target     # the other bounds only when the target leaves a commit or a
        if not force and self.block_tokens > 1:        # whole blocks only (no points there)
            end -= end % self.block_tokens
        if track.committed < end or self.slides:       # window slides (not a decode's 1st call)
            end = min(end, known_positions(request, track.hash_block_size), track.allocated)
        if track.committed >= end and not self.slides:     # nothing to commit or slide
            self.deferred.pop(request.request_id, None)
            return
        bound = capturable(track)
        basis = settled_basis(track) if settled is None else settled
        while track.committed < end:
            while points and points[0] <= track.committed:
                points.pop(0)
            P = self._next_stop(points, end, bound)
            stop = end if P is None else P if P <= bound else P - 1
            if stop > track.committed:
                self._commit(cache, track, stop, basis)
            if P is None or stop != P:
                break
        slide = min(basis, track.committed)
        if slide > track.settled:
            if self.slides:
                cache.commit(request.request_id, 0, None, slide)
            track.settled = slide
        if track.committed < end:
            self.deferred[request.request_id] = track
        else:
            self.deferred.pop(request.request_id, None)

    def _next_stop(self, points, end, bound):
        """The first of ``points`` (ascending) up to ``end`` a commit must end on (or stop
        before, past ``bound``): any past the bound, else the first with an object that is
        not a window; None when there is none."""
        for P in points:
            if P > end:
                return None
            if P > bound or not self.layout.windows_only(P):
                return P
        return None

    def _commit(self, cache, track, stop, basis):
        """Commit up to ``stop``: the ids of positions hybridkv does not hold yet go with it
        (within its known ids -- a prompt the lookup gave it -- none: the lookup's ids are the
        very translation ``token_ids`` would make again, and ``commit`` would only compare
        them to its own)."""
        start, rid = track.committed, track.request.request_id
        slide = min(basis, stop)
        ids = None if stop <= cache.known_tokens(rid) else \
            token_ids(track.request, start, stop, track.hash_block_size)
        self.copies.captured(cache.commit(rid, stop - start, ids, slide))
        track.committed, track.settled = stop, max(track.settled, slide)

    def catch_up(self, cache):
        """Requests stopped before a checkpoint go on where they now may."""
        for track in list(self.deferred.values()):
            self.advance(cache, track)

    def forget(self, request_id):
        self.deferred.pop(request_id, None)

    def clear(self):
        self.deferred.clear()
