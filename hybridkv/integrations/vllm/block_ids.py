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


def group_ids(g, tables, per_page, hit, window_slot, start_block, end_block):
    """vLLM ids of group ``g``'s logical blocks [start_block, end_block) of one request from
    its hybridkv ``tables``: a full group's chain slots; a window group's pages (null once the
    window slid past), the hit's positions [hit - W, hit) read in place from the hit's window
    snapshot ``window_slot`` (pinned while the request lives: the ids its lookup named)."""
    if g.kind == "full":
        return [vllm_id(s, 0, per_page) for s in tables.comp[start_block:end_block]]
    out, bs, W = [], g.block_size, g.window
    for b in range(start_block, end_block):
        p = b * bs
        slot = tables.swa[p // W] if p // W < len(tables.swa) else -1
        if slot >= 0 and p < hit and window_slot is not None:
            slot = window_slot if p + bs > hit - W else -1
        out.append(NULL_BLOCK_ID if slot < 0 else vllm_id(slot, p % W // bs, per_page))
    return out


def hit_ids(g, chain_slots, window_slot, hit, per_page):
    """vLLM ids of a hit's blocks [0, hit) in group ``g`` before its first allocation: the
    chain blocks it reads in place; for a window group null below the window, then the
    window snapshot's blocks (what ``group_ids`` names them by afterwards)."""
    bs = g.block_size
    if g.kind == "full":
        return [vllm_id(s, 0, per_page) for s in chain_slots[:hit // bs]]
    return [vllm_id(window_slot, p % g.window // bs, per_page)
            if p + bs > hit - g.window and window_slot is not None else NULL_BLOCK_ID
            for p in range(0, hit - hit % bs, bs)]
