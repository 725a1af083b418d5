"""V4Mini: a small model with DeepSeek-V4's attention structure, fixed-seed random fp32 weights.

Layers (default ("swa", "csa", "hca", "csa", "hca")): every layer keeps raw shared KV rows for a
sliding window of W tokens; CSA layers add an overlapping m=4 compressor, a lightning indexer
(own m=4 compressor, top-k) and sparse attention; HCA layers add an m' compressor (no overlap)
and dense attention over all visible entries.  Every attention has a per-head sink.
No positional encoding beyond the compressors' learned per-row biases (enough for a model whose
only job is to make wrong cache state visible in its logits).

One memory: the model owns no KV.  ``forward(batch, cache)`` runs one step of many requests
(each a ``SeqWork``: its tokens, start position, the block tables and launch pins the
CacheManager gives it) over the manager's pool tensors (``cache.layer_pools(layer)``): window
rows are written into the request's window pages, closed compressed entries and indexer keys
into its chain blocks, the compressors' open windows read from and written to its tail blocks.
Every kernel launch is one per layer for the whole batch and checks the pools against the
layout's AbiDescs and the pins of the shared blocks it reads.  Dense products are row-invariant
(``_mm``), so a request's logits are the same bits whatever its chunking and batch.
"""
from dataclasses import dataclass, replace
from typing import NamedTuple, Sequence

import torch

from kernels import (CompressSlice, compress_batch, hca_attention, index_topk, sparse_attention,
                     swa_attention)
from kernels.plan import SeqSlice, plan_attention


@dataclass(frozen=True)
class V4MiniConfig:
    vocab: int = 256
    hidden: int = 64
    n_heads: int = 4
    head_dim: int = 16
    layers: tuple = ("swa", "csa", "hca", "csa", "hca")
    window: int = 10
    csa_ratio: int = 4
    hca_ratio: int = 8
    idx_heads: int = 2
    idx_dim: int = 8
    top_k: int = 4
    swa_block: int = 6
    comp_block: int = 4

    def ratio(self, kind):
        return self.csa_ratio if kind == "csa" else self.hca_ratio


def _rms(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


def _mm(x, w):
    """x @ w computed row by row (a batch of one-row products): a row's result does not
    depend on how many rows it is computed with, so a request's logits are the same bits
    whatever its chunking and whatever it is batched with (BLAS blocks differently per
    shape)."""
    return torch.bmm(x.unsqueeze(1), w.expand(x.shape[0], *w.shape)).squeeze(1)


class V4Mini:
    """The reference model.  ``V4Mini(seed=0, backend="torch"|"triton", **config_overrides)``."""

    def __init__(self, seed=0, backend="torch", device="cpu", **overrides):
        self.cfg = c = replace(V4MiniConfig(), **overrides)
        self.backend, self.device = backend, torch.device(device)
        gen = torch.Generator().manual_seed(seed)

        def w(*shape, std=None):
            std = (1.0 / shape[0] ** 0.5) if std is None else std
            return (torch.randn(*shape, generator=gen) * std).to(self.device)

        hd, nh, dm = c.head_dim, c.n_heads, c.hidden
        self.emb = w(c.vocab, dm, std=1.0)
        self.layers = []
        for kind in c.layers:
            one = torch.ones(dm, device=self.device)
            p = {"norm1": one, "norm2": one.clone(),
                 "wq": w(dm, nh * hd), "wkv": w(dm, hd), "sink": w(nh, std=0.5),
                 "wo": w(nh * hd, dm), "w1": w(dm, 2 * dm), "w2": w(2 * dm, dm)}
            if kind != "swa":
                r = c.ratio(kind)
                width, ov = (2 * hd, r) if kind == "csa" else (hd, 0)
                p.update(wckv=w(dm, width), wcg=w(dm, width), ape=w(ov + r, hd, std=0.5))
            if kind == "csa":
                di, ni, r = c.idx_dim, c.idx_heads, c.csa_ratio
                p.update(wikv=w(dm, 2 * di), wig=w(dm, 2 * di), iape=w(2 * r, di, std=0.5),
                         wiq=w(dm, ni * di), wiw=w(dm, ni))
            self.layers.append(p)
        self.norm_f = torch.ones(dm, device=self.device)
        self.head = w(dm, c.vocab)

    # -- compute -------------------------------------------------------------------------
    def _compress(self, batch, ns, xn, group, wkv, wg, ape, pool, tail_pool, tables, which,
                  ratio, overlap, abi):
        """Close every request's windows into ``pool`` (one launch) and roll its open window
        (read from ``which``, written to ``which + '_write'`` of its tables)."""
        width = wkv.shape[1]
        kv_new, g_new = torch.split(_mm(xn, wkv), ns), torch.split(_mm(xn, wg), ns)
        slices, tails = [], []
        for r, (w, kv, g) in enumerate(zip(batch, kv_new, g_new)):
            s, n = w.start, len(w.tokens)
            tab = w.tables[group]
            base = tail_start(s, ratio, overlap)
            blk = tail_pool[getattr(tab, which)]
            rows_kv = torch.cat([blk[:s - base, :width], kv])
            rows_g = torch.cat([blk[:s - base, width:2 * width], g])
            slices.append(CompressSlice(rows_kv, rows_g, tables[r], base, s // ratio,
                                        (s + n) // ratio))
            ends = [(s + w.regular, getattr(tab, which))]
            if w.regular < n:
                ends.append((s + n, getattr(tab, which + "_write")))
            for end, slot in ends:
                keep = tail_start(end, ratio, overlap) - base
                tails.append((slot, rows_kv[keep:end - base], rows_g[keep:end - base]))
        compress_batch(slices, ape, pool, ratio, overlap, backend=self.backend, abi=abi)
        for slot, kv, g in tails:
            tail_pool[slot, :len(kv), :width] = kv
            tail_pool[slot, :len(g), width:2 * width] = g

    def forward(self, batch, cache):
        """One step over ``batch`` (SeqWork each): runs every request's positions
        [start, start + len(tokens)) reading and writing the cache's pools in place; returns
        each request's [len(tokens), vocab] logits.  The cache must have allocated them."""
        c, be, dev = self.cfg, self.backend, self.device
        ns = [len(w.tokens) for w in batch]
        toks = torch.as_tensor([t for w in batch for t in w.tokens], dtype=torch.long, device=dev)
        pos = torch.as_tensor([w.start + i for w, n in zip(batch, ns) for i in range(n)],
                              dtype=torch.long, device=dev)
        x = self.emb[toks]
        for layer, (p, kind) in enumerate(zip(self.layers, c.layers)):
            group = cache.layout.layer_slot[layer][0]
            pools = cache.layer_pools(layer)
            abi = {k: cache.kernel_abi(k, group) for k in pools}
            swa_pool = pools["swa"]["kv"]
            tabs = [w.tables[group] for w in batch]
            xn = _rms(x, p["norm1"])
            q = _mm(xn, p["wq"]).view(-1, c.n_heads, c.head_dim).contiguous()
            pages = torch.cat([torch.as_tensor(t.swa, dtype=torch.long, device=dev)[
                torch.arange(w.start, w.start + n, device=dev) // c.window]
                for w, n, t in zip(batch, ns, tabs)])
            swa_pool[pages, pos % c.window] = _mm(xn, p["wkv"])
            plan = plan_attention([SeqSlice(w.start, n, t.swa, t.comp, t.idx)
                                   for w, n, t in zip(batch, ns, tabs)], c.top_k, dev)
            pins = _Pins([w.pins.get(group, ()) for w in batch])
            kw = dict(backend=be, pins=pins, swa_abi=abi["swa"])
            if kind == "swa":
                o = swa_attention(q, swa_pool, plan, p["sink"], c.window, **kw)
            else:
                r = c.ratio(kind)
                comp_pool = pools["comp"]["kv"]
                self._compress(batch, ns, xn, group, p["wckv"], p["wcg"], p["ape"], comp_pool,
                               pools["tail"]["rows"], plan.comp_table, "tail", r,
                               r if kind == "csa" else 0, abi["comp"])
                kw["comp_abi"] = abi["comp"]
            if kind == "csa":
                keys = pools["idx"]["keys"]
                self._compress(batch, ns, xn, group, p["wikv"], p["wig"], p["iape"], keys,
                               pools["idx"]["tail"], plan.idx_table, "itail", r, r, abi["idx"])
                iq = _mm(xn, p["wiq"]).view(-1, c.idx_heads, c.idx_dim).contiguous()
                index_topk(iq, _mm(xn, p["wiw"]).contiguous(), keys, plan, r, backend=be,
                           pins=pins, abi=abi["idx"])
                o = sparse_attention(q, swa_pool, comp_pool, plan, p["sink"], c.window, **kw)
            elif kind == "hca":
                o = hca_attention(q, swa_pool, comp_pool, plan, p["sink"], c.window, r, **kw)
            x = x + _mm(o.reshape(len(o), -1), p["wo"])
            x = x + _mm(torch.nn.functional.silu(_mm(_rms(x, p["norm2"]), p["w1"])), p["w2"])
        return list(torch.split(_mm(_rms(x, self.norm_f), self.head), ns))

    def layout(self):
        """The cache layout this model's memory has (hybridkv.ModelLayout.from_model)."""
        from hybridkv.layout import ModelLayout
        return ModelLayout.from_model(self.cfg)


class _Pins:
    """The pins of every request of a launch, chained; iterated anew by each launch (the cache's
    LivePins read the blocks' current values then)."""

    def __init__(self, parts):
        self.parts = parts

    def __iter__(self):
        for part in self.parts:
            yield from part


class SeqWork(NamedTuple):
    """One request's part of a forward: its tokens at positions [start, start + len(tokens)),
    its block tables (group -> GroupTables, from the CacheManager) and, per group, the
    PinCheck of every shared block its launches read (CacheManager.launch_pins).  The first
    ``regular`` tokens are verified ones, the rest drafts: the compressors' open windows are
    written at start + regular into the working tails and, when there are drafts, at the end
    into the draft tail targets (``tables.*_write``)."""
    tokens: Sequence[int]
    start: int
    tables: dict
    pins: dict
    regular: int


def tail_start(H, ratio, overlap):
    """First raw row the compressor's open window at H still needs."""
    return max(0, (H // ratio) * ratio - overlap)
