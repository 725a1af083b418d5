"""vLLM block ids <-> hybridkv pool slots: the one translation of block identity.

vLLM has ONE block-id space shared by every KV cache group (``KVCacheConfig.num_blocks`` ids,
id 0 the null block); hybridkv has one pool per (kind, group).  Until hybridkv's single block
arena lands, ids 1 .. num_blocks - 1 are partitioned once into equal, disjoint ranges, one per
group, and pool slot s of a group whose pool block spans k vLLM blocks (a window page) owns ids
``base + s*k .. base + s*k + k - 1``.  ``vllm_id`` is the only function that turns a slot into
an id: the arena will replace it by its own ids.
"""
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.specs import window_blocks

NULL_BLOCK_ID = 0


class BlockIds:
    def __init__(self, layout, num_blocks):
        usable = num_blocks - 1                       # id 0 is vLLM's null block
        share = usable // len(layout.groups)
        self.num_blocks = num_blocks
        self.pool_sizes = {}                          # pool key -> pool blocks
        self.base = {}                                # pool key -> (first id, ids per block)
        for i, g in enumerate(layout.groups):
            per = window_blocks(g)
            n = share // per
            if n < 1:
                raise BadArgument("num_blocks too small for a partition of vLLM's block ids",
                                  {"num_blocks": num_blocks, "group": g.name, "needs": per + 1})
            pk = (g.kinds[0], g.name)
            self.pool_sizes[pk] = n
            self.base[pk] = (1 + i * share, per)

    def vllm_id(self, pool_key, slot, sub=0):
        """The vLLM block id of vLLM block ``sub`` inside pool block ``slot`` of ``pool_key``."""
        first, per = self.base[pool_key]
        if not 0 <= slot < self.pool_sizes[pool_key] or not 0 <= sub < per:
            raise BadArgument("pool slot outside its vLLM id range", (pool_key, slot, sub))
        return first + slot * per + sub

    def ids_per_block(self, pool_key):
        return self.base[pool_key][1]
