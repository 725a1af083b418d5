"""vLLM's one block-id space laid over hybridkv's pools: which vLLM ids a pool block owns.

vLLM numbers ``KVCacheConfig.num_blocks`` ids (id 0 its null block), shared by every group; a
pool block of hybridkv spans ``span`` of them (a window page of W' rows = W'/block_size vLLM
blocks; any other block one).  Two ways to lay the ids out:

  PagedIds  hybridkv's block arena (``CacheManager(num_pages=N)``): every pool draws pages
            from one shared arena, a page spans P = the widest pool block's span, so capacity
            moves between pools freely; a narrower block leaves P - span of its page's ids
            unused.  Used when P = 1 (no window wider than a block): nothing is wasted.
  PoolIds   per-pool capacity (``CacheManager(num_blocks={pool: n - 1})``): pool p owns the
            contiguous ids ``base_p .. base_p + n_p * span_p - 1`` of its n_p slots (n_p - 1
            blocks and the pool's spare slot, where a relocation moves a block), none
            unused.  Used when P > 1 (full + SWA hybrids, DeepSeek-V4; unless num_blocks is
            too small to give every pool two slots), where the arena would leave most ids of
            every chain block unused (P = 8 for a 128-token window over 16-token blocks, 16
            for V4's 128-row compressor-state window over 8-token blocks).
PoolIds' split (``pool_split``): a window pool first gets its working set -- the pages one
scheduling step's tokens (``max_in_flight_tokens``) write plus four for each running request
(``max_num_seqs``: its window's two pages, its provisional end checkpoint and a checkpoint its
allocation is writing, neither evictable); when the working sets would take more than three
quarters of the ids, the running requests' pages shrink first, then the step's. The rest is
shared so that a window checkpoint (one page in every window pool) can be kept for every
CHECKPOINT_SPACING_TOKENS tokens of cached chain (every chain pool's blocks of that many tokens;
about one checkpoint per cached prompt of that length, as vLLM keeps a prompt's window state at
its replay boundary): each window pool adds that many checkpoint pages, and the chain pools
share what is left by their per-token ids.
``vllm_id`` / ``free_ids`` / ``ids_for`` are the only translations of block identity and
counts; ``at_once`` / ``fits`` answer whether a whole prompt fits (vLLM's
``full_sequence_must_fit``): a window pool's count is capped at the pages a request holds at
once (one step's tokens plus the window: the pages behind the window are given back as it
slides), as vLLM caps a sliding-window group's.
"""
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.block_ids import ids_per_page, num_pages, vllm_id
from hybridkv.integrations.vllm.specs import window_blocks

DEFAULT_IN_FLIGHT_TOKENS = 8192     # vLLM's default max_num_batched_tokens
DEFAULT_MAX_NUM_SEQS = 16           # vLLM's test schedulers' default
CHECKPOINT_SPACING_TOKENS = 16384   # PoolIds keeps a window checkpoint per this many chain tokens
PAGES_PER_RUNNING_REQUEST = 4       # a window's two pages, two checkpoints being kept


def _ceil(a, b):
    return -(-a // b)


class PagedIds:
    """hybridkv's arena: pages of ``per_page`` vLLM ids (see the module docstring)."""

    def __init__(self, layout, num_blocks, max_in_flight_tokens=None):
        self.per_page = ids_per_page(layout)
        self.num_pages = num_pages(layout, num_blocks)
        self.cap = window_caps(layout, max_in_flight_tokens)

    def cache_kwargs(self):
        return {"num_pages": self.num_pages}

    def vllm_id(self, pool, slot, sub=0):
        return vllm_id(slot, sub, self.per_page)

    def free_ids(self, available):
        """vLLM ids an allocation could take now, from ``CacheManager.available_blocks()``
        (in the arena the same page count for every pool)."""
        return max(available.values()) * self.per_page

    def ids_for(self, blocks):
        """vLLM ids ``blocks`` (pool key -> new blocks) take."""
        return sum(blocks.values()) * self.per_page

    def at_once(self, blocks):
        """``blocks`` with every window pool's count capped at the pages held at once."""
        return {pk: min(n, self.cap.get(pk, n)) for pk, n in blocks.items()}

    def fits(self, blocks, available):
        """Whether ``blocks`` fit in ``CacheManager.available_blocks()`` (one arena)."""
        return sum(blocks.values()) <= max(available.values())


class PoolIds:
    """Per-pool capacity over disjoint id ranges (see the module docstring)."""

    def __init__(self, layout, num_blocks, max_in_flight_tokens=None, max_num_seqs=None):
        self.span = {(kind, g.name): window_blocks(g) for g in layout.groups
                     for kind in g.kinds}
        self.slots = pool_split(layout, num_blocks - 1, max_in_flight_tokens
                                or DEFAULT_IN_FLIGHT_TOKENS, max_num_seqs or
                                DEFAULT_MAX_NUM_SEQS)
        self.cap = window_caps(layout, max_in_flight_tokens)
        self.base, nxt = {}, 1
        for pk in layout.pool_keys():
            self.base[pk] = nxt
            nxt += self.slots[pk] * self.span[pk]

    def cache_kwargs(self):
        return {"num_blocks": {pk: n - 1 for pk, n in self.slots.items()}}

    def vllm_id(self, pool, slot, sub=0):
        if not (0 <= slot < self.slots[pool] and 0 <= sub < self.span[pool]):
            raise BadArgument("pool block outside its vLLM id range", (pool, slot, sub))
        return self.base[pool] + slot * self.span[pool] + sub

    def free_ids(self, available):
        return sum(n * self.span[pk] for pk, n in available.items())

    def ids_for(self, blocks):
        return sum(n * self.span[pk] for pk, n in blocks.items())

    at_once = PagedIds.at_once

    def fits(self, blocks, available):
        """Whether ``blocks`` fit, pool by pool."""
        return all(n <= available[pk] for pk, n in blocks.items())


def window_caps(layout, max_in_flight_tokens):
    """window pool -> the pages one request holds at once: a step's tokens plus the window."""
    tokens = max_in_flight_tokens or DEFAULT_IN_FLIGHT_TOKENS
    return {("swa", g.name): _ceil(tokens, g.window) + 2 for g in layout.groups
            if "swa" in g.kinds}


def pool_split(layout, num_ids, max_in_flight_tokens, max_num_seqs):
    """pool key -> slots of PoolIds over ``num_ids`` vLLM ids (the rule: module docstring)."""
    step, chains = {}, {}                   # window pool -> (pages of one step, span) / bs
    for g in layout.groups:
        for kind in g.kinds:
            if kind == "swa":
                step[(kind, g.name)] = (_ceil(max_in_flight_tokens, g.window) + 2,
                                        window_blocks(g))
            else:
                chains[(kind, g.name)] = g.block_size
    per_checkpoint = sum(span for _, span in step.values())    # ids of one page per pool
    step_ids = sum(pages * span for pages, span in step.values())
    seqs_ids = PAGES_PER_RUNNING_REQUEST * max_num_seqs * per_checkpoint
    most = 0.75 * num_ids if chains else num_ids
    # the running requests' pages shrink first, the step's only when they alone exceed
    step_scale = min(1.0, most / step_ids) if step else 1.0
    seqs = PAGES_PER_RUNNING_REQUEST * max_num_seqs * \
        min(1.0, max(0.0, most - step_ids) / seqs_ids) if step else 0
    rest = num_ids - int(step_ids * step_scale + seqs * per_checkpoint)
    checkpoints = 0
    if chains and step:
        per_spacing = sum(CHECKPOINT_SPACING_TOKENS / bs for bs in chains.values())
        checkpoints = int(rest / (per_checkpoint + per_spacing))
    slots = {pk: max(2, int(pages * step_scale + seqs) + checkpoints)
             for pk, (pages, _) in step.items()}
    used = sum(slots[pk] * span for pk, (_, span) in step.items())
    while chains and used > 0.75 * num_ids and max(slots[pk] for pk in step) > 2:
        widest = max((pk for pk in step if slots[pk] > 2),          # small configs only
                     key=lambda pk: slots[pk] * step[pk][1])
        slots[widest] -= 1
        used -= step[widest][1]
    rest = num_ids - used
    weight = sum(1 / bs for bs in chains.values())
    for pk, bs in chains.items():
        slots[pk] = int(rest * (1 / bs) / weight)
    if any(n < 2 for n in slots.values()):
        raise BadArgument("num_blocks too small for one block and a spare slot per pool",
                          {"num_blocks": num_ids + 1, "split": slots})
    return slots


def id_space(layout, num_blocks, max_in_flight_tokens=None, max_num_seqs=None):
    """PagedIds when every pool block spans one vLLM id, PoolIds otherwise -- unless
    ``num_blocks`` is too small to give every pool a block and its spare slot (a handful of
    ids): the arena then still serves (a whole page per block)."""
    if ids_per_page(layout) > 1:
        try:
            return PoolIds(layout, num_blocks, max_in_flight_tokens, max_num_seqs)
        except BadArgument:
            pass
    return PagedIds(layout, num_blocks, max_in_flight_tokens)
