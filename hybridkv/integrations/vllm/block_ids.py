"""vLLM block ids <-> hybridkv arena pages: the one translation of block identity.

vLLM has ONE block-id space shared by every KV cache group (``KVCacheConfig.num_blocks`` ids,
id 0 the null block); hybridkv's block arena (``CacheManager(layout, num_pages=N)``) has ONE
page id space shared by every pool, and a block table's slot IS the arena page id.  A page holds
one pool block of any group: a full-attention block is one vLLM block, a sliding-window page
(W' = the window rounded up to block_size) is W'/block_size vLLM blocks, so a page spans
``ids_per_page`` vLLM ids (the most any pool block spans: 1 without a window wider than a
block, and then vLLM id = page id + 1).  Page p owns ids ``1 + p*P .. p*P + P``; a pool block
smaller than the page leaves the rest of its ids unused (the arena's padding, in ids).
``vllm_id`` is the only function that turns a slot into an id.
"""
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.specs import window_blocks

NULL_BLOCK_ID = 0


def ids_per_page(layout):
    """vLLM block ids one arena page spans (the largest pool block, in vLLM blocks)."""
    return max(window_blocks(g) for g in layout.groups)


def num_pages(layout, num_blocks):
    """Arena pages over vLLM's ``num_blocks`` ids: all but the null block, ``ids_per_page``
    ids a page."""
    pages = (num_blocks - 1) // ids_per_page(layout)
    if pages < 1:
        raise BadArgument("num_blocks too small for one arena page",
                          {"num_blocks": num_blocks, "needs": ids_per_page(layout) + 1})
    return pages


def vllm_id(page, sub=0, per_page=1):
    """The vLLM block id of vLLM block ``sub`` inside arena page ``page``."""
    if page < 0 or not 0 <= sub < per_page:
        raise BadArgument("arena page outside vLLM's id space", (page, sub, per_page))
    return 1 + page * per_page + sub
