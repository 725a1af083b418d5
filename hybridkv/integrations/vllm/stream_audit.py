"""Why a side resumed where it did, at each admission of a stream (``StreamRun(explain=...)``).

``StockAudit`` (vLLM's own manager): its per-group longest hits (vLLM's coordinator,
``find_longest_cache_hit_per_group``, where it has one) and, for the hit the Scheduler adopts,
hybridkv's rule for what a checkpoint at H consists of (``ModelLayout.objects_at(H)``: every
chain block below H, the open block when H is inside one, each window's rows [H-W, H)) checked
against the blocks vLLM handed over: an object whose block is the null block, or holds
another prefix's hash, is a finding -- vLLM resuming where a group's state is incomplete.
``OursAudit`` (hybridkv's): the funnel's HitPlan of the lookup the Scheduler adopted -- each
group's longest H alone, the longest candidates it rejected (layer and check), and how far
the prompt's chain blocks are cached (``chain_tokens``: past a resume point, only a window's
checkpoint there was missing).
"""
from hybridkv.integrations.vllm.specs import layout_from_vllm
from vllm.v1.core.kv_cache_utils import get_block_hash

MAX_REJECTIONS = 4              # rejections kept per admission (longest H first)


def group_index(name):
    return int(name[1:])        # layout_from_vllm names vLLM group i "g<i>"


class StockAudit:
    def __init__(self, manager, hash_block_size):
        self.manager, self.hash_block_size = manager, hash_block_size
        self.config = manager.kv_cache_config
        self.layout = layout_from_vllm(self.config)

    def __call__(self, request, hit, blocks):
        per_group = getattr(self.manager.coordinator, "find_longest_cache_hit_per_group",
                            None)
        group_hits = None
        if per_group is not None and request.block_hashes:
            group_hits = list(per_group(request.block_hashes, request.num_tokens - 1)[1])
        return {"group_hits": group_hits,
                "incomplete": self.incomplete(request, hit, blocks) if hit else []}

    def incomplete(self, request, hit, blocks):
        """hybridkv's objects of a checkpoint at ``hit`` that vLLM's blocks do not hold."""
        found = []
        for obj in self.layout.objects_at(hit):
            i = group_index(obj.group)
            spec = self.config.kv_cache_groups[i].kv_cache_spec
            bs, have = spec.block_size, blocks.blocks[i] if blocks is not None else ()
            if obj.kind == "swa":
                window = getattr(spec, "sliding_window", obj.at)
                needed = range(max(0, obj.at - window) // bs, (obj.at - 1) // bs + 1)
            elif obj.exact:                 # the open block at H: a part of block H // bs
                needed = range(obj.at // bs, obj.at // bs + 1)
            else:                           # a chain block ending at obj.at
                needed = range(obj.at // bs - 1, obj.at // bs)
            for b in needed:
                why = self._block_problem(request, have, b, bs)
                if why:
                    found.append({"group": i, "object": obj.kind, "at": obj.at,
                                  "block": b, "why": why})
        return found

    def _block_problem(self, request, have, b, bs):
        if b >= len(have) or have[b].is_null:
            return "no block"
        end = (b + 1) * bs // self.hash_block_size - 1
        if have[b].block_hash is None or end >= len(request.block_hashes) or \
                get_block_hash(have[b].block_hash) != request.block_hashes[end]:
            return "another prefix's block"
        return ""


class OursAudit:
    """Keeps the HitPlan of each lookup (wrapping the CacheManager's ``lookup``)."""

    def __init__(self, manager):
        self.manager, self.plans = manager, {}
        lookup = manager.cache.lookup

        def keep(request_id, token_ids, salt=b""):
            plan = self.plans[request_id] = lookup(request_id, token_ids, salt)
            return plan
        manager.cache.lookup = keep

    def __call__(self, request, hit, blocks):
        plan = self.plans.get(request.request_id)
        if plan is None or plan.reuse_tokens != hit:
            return {"group_hits": None, "rejections": [], "chain_tokens": None}
        rejections = [{"H": r.H, "group": group_index(r.group), "layer": r.layer,
                       "check": r.check} for r in plan.rejections[:MAX_REJECTIONS]]
        group_hits = [plan.group_hits.get(g.name, 0) for g in self.manager.layout.groups]
        return {"group_hits": group_hits, "rejections": rejections,
                "chain_tokens": plan.branch}
