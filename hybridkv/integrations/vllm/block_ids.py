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
from functools import partial
from itertools import chain, compress, count, islice, repeat, takewhile
from operator import le

from hybridkv.cache.arena import NO_PAGE
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.specs import window_blocks
from hybridkv.layout import ceil_div

NULL_BLOCK_ID = 0
HOLDS = partial(le, 0)   # a tables.swa entry the request holds (slid-past pages are -1)


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


def sub_ids(pages, lo, hi):
    """``sub_id`` of each sub-page lo..hi-1 of a block's ``pages`` (``vllm_ids`` at once
    where the block holds them all)."""
    run = pages[lo:hi]
    if NO_PAGE not in run:
        return vllm_ids(run)
    return [NULL_BLOCK_ID if page == NO_PAGE else vllm_id(page) for page in run]


def group_ids(g, tables, pages_of, hit, window_slot, start_block, end_block):
    """vLLM ids of group ``g``'s logical blocks [start_block, end_block) of one request from
    its hybridkv ``tables``: a full group's chain slots; a window group's pages (null once the
    window slid past), the hit's positions [hit - W', hit) read in place from the hit's window
    snapshot ``window_slot`` (pinned while the request lives: the ids its lookup named).
    ``pages_of(slot)``: the block's arena pages (``CacheManager.slot_pages``).  A window page
    holds k = W'/block_size blocks, block b being sub-page b % k of page b // k: the ids go
    page by page, a run of pages the window slid past (slot -1) as one run of nulls."""
    if g.kind == "full":
        return vllm_ids(tables.comp[start_block:end_block])
    bs, swa = g.block_size, tables.swa
    k = g.window // bs
    hit_blocks = ceil_div(hit, bs) if window_slot is not None else 0   # blocks p < hit
    first = hit_window_block(g, hit) if start_block < hit_blocks else 0
    out, b, hit_pages = [], start_block, None
    while b < end_block:
        j, s0 = divmod(b, k)
        slot = swa[j] if j < len(swa) else -1
        if slot < 0:                                    # to the next page the request holds
            live = next(compress(count(j + 1), map(HOLDS, islice(swa, j + 1, None))), None)
            upto = end_block if live is None else min(end_block, live * k)
            out += repeat(NULL_BLOCK_ID, upto - b)
            b = upto
            continue
        if s0 == 0 and b >= hit_blocks and end_block - b >= 2 * k:   # whole pages in a row
            run = list(takewhile(HOLDS, islice(swa, j, min(len(swa), end_block // k))))
            if len(run) > 1:                            # their sub-pages, page by page
                pages = list(chain.from_iterable(map(pages_of, run)))
                out += sub_ids(pages, 0, len(pages))
                b += len(run) * k
                continue
        n = min(end_block - b, k - s0)
        if b < hit_blocks:                              # below the hit: its window snapshot
            pages = None
            for c in range(b, b + n):
                if c >= hit_blocks:
                    pages = pages or pages_of(slot)
                    out.append(sub_id(pages, c % k))
                elif c >= first:                        # reaches into the hit's window
                    hit_pages = hit_pages or pages_of(window_slot)
                    out.append(sub_id(hit_pages, c % k))
                else:
                    out.append(NULL_BLOCK_ID)
        else:
            out += sub_ids(pages_of(slot), s0, s0 + n)
        b += n
    return out


def hit_window_block(g, hit):
    """The first block of window group ``g`` that reaches into a hit's window
    [first_read(hit), hit): the first whose positions end past ``first_read(hit)``."""
    return g.first_read(hit) // g.block_size


def hit_ids(g, chain_slots, window_slot, hit, pages_of):
    """vLLM ids of a hit's blocks [0, hit) in group ``g`` before its first allocation: the
    chain blocks it reads in place; for a window group null below the window, then the
    window snapshot's blocks (what ``group_ids`` names them by afterwards)."""
    bs = g.block_size
    if g.kind == "full":
        return vllm_ids(chain_slots[:hit // bs])
    pages = pages_of(window_slot) if window_slot is not None else ()
    num_blocks, k = hit // bs, g.window // bs
    if not pages:
        return [NULL_BLOCK_ID] * num_blocks
    first = min(num_blocks, hit_window_block(g, hit))
    return [NULL_BLOCK_ID] * first + [sub_id(pages, c % k) for c in range(first, num_blocks)]
