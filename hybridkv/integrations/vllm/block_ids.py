"""vLLM block ids <-> hybridkv arena pages: the one translation of block identity.

vLLM has ONE block-id space shared by every KV cache group (``KVCacheConfig.num_blocks`` ids,
id 0 the null block); hybridkv's block arena (``CacheManager(layout, num_pages=N)``) has ONE
page id space shared by every pool.  One arena page is one vLLM block: page p is vLLM id p + 1
(``num_pages`` = every id but the null block).  A full-attention block is one page; a
sliding-window page of W' positions (the window rounded up to block_size) is W'/block_size
vLLM blocks, so its pool's blocks span that many pages (``block_pages``): the block table
names the block by its first page, ``CacheManager.slot_pages`` lists its sub-pages, and vLLM
block ``sub`` of the window page (positions whose ``position mod W'`` fall in it) is its page
``sub``.  As in vLLM's SlidingWindowManager, a window block's pages are taken as the request's
positions reach them and given back once the window slid past them
(hybridkv.cache.subpages): a sub-page the block does not hold is the null block.  ``vllm_id``
and ``vllm_ids`` (the same rule over a list) are the only functions that turn a page into an id.
"""
from hybridkv.cache.arena import NO_PAGE
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.specs import window_blocks

NULL_BLOCK_ID = 0


def block_pages(layout):
    """Pages a block of each multi-block pool takes: a window group's W'/block_size."""
    return {("swa", g.name): window_blocks(g) for g in layout.groups if g.kind == "swa"}


def num_pages(num_blocks):
    """Arena pages over vLLM's ``num_blocks`` ids: all but the null block."""
    if num_blocks < 2:
        raise BadArgument("num_blocks too small for one arena page",
                          {"num_blocks": num_blocks, "needs": 2})
    return num_blocks - 1


def vllm_id(page):
    """The vLLM block id of arena page ``page``."""
    if page < 0:
        raise BadArgument("arena page outside vLLM's id space", page)
    return 1 + page


def vllm_ids(pages):
    """``vllm_id`` of each of ``pages`` (one range check over them, no call per page)."""
    if pages and min(pages) < 0:
        raise BadArgument("arena page outside vLLM's id space", min(pages))
    return [page + 1 for page in pages]


def sub_id(pages, sub):
    """The vLLM id of sub-page ``sub`` of a block's ``pages``: null where it holds none."""
    return NULL_BLOCK_ID if pages[sub] == NO_PAGE else vllm_id(pages[sub])


def group_ids(g, tables, pages_of, hit, window_slot, start_block, end_block):
    """vLLM ids of group ``g``'s logical blocks [start_block, end_block) of one request from
    its hybridkv ``tables``: a full group's chain slots; a window group's pages (null once the
    window slid past), the hit's positions [hit - W', hit) read in place from the hit's window
    snapshot ``window_slot`` (pinned while the request lives: the ids its lookup named).
    ``pages_of(slot)``: the block's arena pages (``CacheManager.slot_pages``)."""
    if g.kind == "full":
        return vllm_ids(tables.comp[start_block:end_block])
    out, bs, W, seen = [], g.block_size, g.window, {}
    oldest = g.first_read(hit) if window_slot is not None else 0    # the hit's window start
    for b in range(start_block, end_block):
        p = b * bs
        slot = tables.swa[p // W] if p // W < len(tables.swa) else -1
        if slot >= 0 and p < hit and window_slot is not None:
            slot = window_slot if p + bs > oldest else -1
        if slot < 0:
            out.append(NULL_BLOCK_ID)
            continue
        if slot not in seen:
            seen[slot] = pages_of(slot)
        out.append(sub_id(seen[slot], p % W // bs))
    return out


def hit_ids(g, chain_slots, window_slot, hit, pages_of):
    """vLLM ids of a hit's blocks [0, hit) in group ``g`` before its first allocation: the
    chain blocks it reads in place; for a window group null below the window, then the
    window snapshot's blocks (what ``group_ids`` names them by afterwards)."""
    bs = g.block_size
    if g.kind == "full":
        return vllm_ids(chain_slots[:hit // bs])
    pages = pages_of(window_slot) if window_slot is not None else ()
    oldest = g.first_read(hit)
    return [sub_id(pages, p % g.window // bs) if p + bs > oldest and pages
            else NULL_BLOCK_ID for p in range(0, hit - hit % bs, bs)]
