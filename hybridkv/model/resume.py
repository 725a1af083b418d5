"""Resume checks: continuing from a checkpoint at H must equal the cold run, bit for bit.

"Same chunking": the cold run follows a chunk schedule (every ``chunk`` tokens plus a boundary at
every checkpoint length); the resumed run restores the checkpoint into a *different* cache
(NaN-filled pools, physical blocks handed out in the opposite order) and follows the cold
schedule from H.  Both runs use the same backend; logits are compared with torch.equal.
"""
import math
from functools import reduce
from typing import NamedTuple

import torch

from hybridkv.model.cache import SeqState


class GridResult(NamedTuple):
    lengths: list
    mismatches: int
    bad: list          # (H, max_abs_diff) for every mismatching H
    span: int


class GreedyResult(NamedTuple):
    H: int
    cold_tokens: list
    resumed_tokens: list
    logits_equal: bool


def grid_lengths(cfg, longer=(50, 70)):
    """{m-1, m, m+1} per ratio, W-1..W+1, SWA/compressed block and LCM boundaries +-1, longer."""
    pts = {cfg.csa_ratio, cfg.hca_ratio, cfg.window, cfg.swa_block, 2 * cfg.swa_block,
           cfg.comp_block * cfg.csa_ratio, cfg.comp_block * cfg.hca_ratio}
    lcm = reduce(math.lcm, [cfg.swa_block, cfg.csa_ratio, cfg.hca_ratio,
                            cfg.comp_block * cfg.csa_ratio, cfg.comp_block * cfg.hca_ratio])
    pts.add(lcm)
    out = {h + d for h in pts for d in (-1, 0, 1)} | set(longer)
    return sorted(h for h in out if h > 0)


def prompt_tokens(cfg, n, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (n,), generator=g).tolist()


def schedule(start, end, chunk, cuts=()):
    """Chunk boundaries in [start, end]: every multiple of ``chunk`` and every cut."""
    b = {start, end} | {x for x in range(0, end, chunk) if x > start}
    b |= {x for x in cuts if start < x < end}
    b = sorted(b)
    return list(zip(b[:-1], b[1:]))


def _fresh_cache(model, num_blocks):
    cache = model.new_cache(num_blocks)
    for free in cache.free_blocks.values():
        free.reverse()
    return cache


def check_grid(model, lengths, chunk=8, span=12, num_blocks=64):
    """One cold run over max(lengths) + span tokens with a checkpoint at every H in ``lengths``;
    for each H, restore and rerun the cold schedule's chunks that start in [H, H + span)."""
    lengths = sorted(lengths)
    end = lengths[-1] + span + chunk
    toks = prompt_tokens(model.cfg, end)
    sched = schedule(0, end, chunk, lengths)
    cache = model.new_cache(num_blocks)
    st, ckpts, logits = SeqState(cache), {}, []
    for a, b in sched:
        if a in lengths:
            ckpts[a] = st.checkpoint()
        logits.append(model.forward(toks[a:b], st))
    cold = torch.cat(logits)
    bad = []
    for H in lengths:
        st2 = SeqState.restore(_fresh_cache(model, num_blocks), ckpts[H])
        mine = [(a, b) for a, b in sched if a >= H and a < H + span]
        got = torch.cat([model.forward(toks[a:b], st2) for a, b in mine])
        want = cold[H:mine[-1][1]]
        if not torch.equal(got, want):
            bad.append((H, float((got - want).abs().nan_to_num(float("inf")).max())))
    return GridResult(lengths, len(bad), bad, span)


def greedy_resume(model, H, prompt_len, new_tokens=6, chunk=8, num_blocks=64):
    """Greedy generation from a prompt, cold vs resumed from the checkpoint at H."""
    toks = prompt_tokens(model.cfg, prompt_len, seed=99 + H)
    st = SeqState(model.new_cache(num_blocks))
    model.prefill(toks[:H], st, chunk)
    ckpt = st.checkpoint()
    cold_tok, cold_lg = model.generate(toks[H:], new_tokens, st, chunk)
    st2 = SeqState.restore(_fresh_cache(model, num_blocks), ckpt)
    res_tok, res_lg = model.generate(toks[H:], new_tokens, st2, chunk)
    return GreedyResult(H, cold_tok, res_tok, torch.equal(cold_lg, res_lg))
