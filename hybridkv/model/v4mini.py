"""V4Mini: a small model with DeepSeek-V4's attention structure, fixed-seed random fp32 weights.

Layers (default ("swa", "csa", "hca", "csa", "hca")): every layer keeps raw shared KV rows for a
sliding window of W tokens; CSA layers add an overlapping m=4 compressor, a lightning indexer
(own m=4 compressor, top-k) and sparse attention; HCA layers add an m' compressor (no overlap)
and dense attention over all visible entries.  Every attention has a per-head sink.
No positional encoding beyond the compressors' learned per-row biases (enough for a model whose
only job is to make wrong cache state visible in its logits).

``forward(tokens, state)`` runs one chunk (prefill chunk or a decode step) against a SeqState
and returns the chunk's logits; ``backend`` picks the Triton kernels or the torch references
(the same guarded wrappers either way).
"""
from dataclasses import dataclass, replace

import torch

from kernels import compress, hca_attention, index_topk, sparse_attention, swa_attention
from kernels.plan import SeqSlice, plan_attention
from hybridkv.model.cache import PagedCache, SeqState, Tail


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

    # -- state ---------------------------------------------------------------------------
    def new_cache(self, num_blocks=64, fill=float("nan")):
        return PagedCache(self.cfg, num_blocks, self.device, fill)

    def new_state(self, cache):
        return SeqState(cache)

    # -- compute -------------------------------------------------------------------------
    def _compress(self, tail, kv, gate, ape, pool, table, s, n, ratio, overlap):
        rows_kv, rows_g = torch.cat([tail.kv, kv]), torch.cat([tail.gate, gate])
        compress(rows_kv, rows_g, ape, pool, table, tail.start, s // ratio, (s + n) // ratio,
                 ratio, overlap, backend=self.backend)
        keep = max(0, ((s + n) // ratio) * ratio - overlap)
        return Tail(keep, rows_kv[keep - tail.start:].clone(), rows_g[keep - tail.start:].clone())

    def forward(self, tokens, state):
        """Run positions [state.length, state.length + len(tokens)); returns [T, vocab] logits
        and advances ``state`` (blocks reserved first, all or none)."""
        c, be = self.cfg, self.backend
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(-1)
        s, n = state.length, tokens.numel()
        state.reserve(n)
        x = self.emb[tokens]
        pos = torch.arange(s, s + n, device=self.device)
        for layer, (p, ls) in enumerate(zip(self.layers, state.layers)):
            cache = state.cache
            swa_pool = cache.pool("swa", layer)
            xn = _rms(x, p["norm1"])
            q = (xn @ p["wq"]).view(n, c.n_heads, c.head_dim).contiguous()
            bt = torch.as_tensor(ls.swa, dtype=torch.long, device=self.device)
            swa_pool[bt[pos // c.swa_block], pos % c.swa_block] = xn @ p["wkv"]
            plan = plan_attention([SeqSlice(s, n, ls.swa, ls.comp, ls.idx)], c.top_k,
                                  self.device)
            if ls.kind == "swa":
                o = swa_attention(q, swa_pool, plan, p["sink"], c.window, backend=be)
            else:
                r = c.ratio(ls.kind)
                comp_pool = cache.pool("comp", layer)
                ls.tail = self._compress(ls.tail, xn @ p["wckv"], xn @ p["wcg"], p["ape"],
                                         comp_pool, plan.comp_table[0], s, n, r,
                                         r if ls.kind == "csa" else 0)
            if ls.kind == "csa":
                ls.idx_tail = self._compress(ls.idx_tail, xn @ p["wikv"], xn @ p["wig"],
                                             p["iape"], cache.pool("idx", layer),
                                             plan.idx_table[0], s, n, r, r)
                iq = (xn @ p["wiq"]).view(n, c.idx_heads, c.idx_dim).contiguous()
                index_topk(iq, (xn @ p["wiw"]).contiguous(), cache.pool("idx", layer), plan, r,
                           backend=be)
                o = sparse_attention(q, swa_pool, comp_pool, plan, p["sink"], c.window,
                                     backend=be)
            elif ls.kind == "hca":
                o = hca_attention(q, swa_pool, comp_pool, plan, p["sink"], c.window, r,
                                  backend=be)
            x = x + o.reshape(n, -1) @ p["wo"]
            h = _rms(x, p["norm2"])
            x = x + torch.nn.functional.silu(h @ p["w1"]) @ p["w2"]
        state.length = s + n
        state.slide()
        return _rms(x, self.norm_f) @ self.head

    def prefill(self, tokens, state, chunk=8):
        """Chunked prefill: ``forward`` over consecutive chunks of ``chunk`` tokens."""
        tokens = list(tokens)
        outs = [self.forward(tokens[i:i + chunk], state) for i in range(0, len(tokens), chunk)]
        return torch.cat(outs) if outs else torch.zeros((0, self.cfg.vocab))

    def generate(self, prompt, max_new_tokens, state, chunk=8):
        """Greedy: prefill ``prompt`` on top of whatever ``state`` holds, then decode.
        ``prompt`` must be non-empty (the next token needs the last position's logits; a
        cache hit on the whole prompt resumes at len(prompt) - 1).  Returns (tokens, logits
        of the decode steps)."""
        if len(prompt) == 0:
            raise ValueError("generate needs at least one prompt token to recompute")
        logits = self.prefill(prompt, state, chunk)
        out, steps = [], []
        for _ in range(max_new_tokens):
            tok = int(logits[-1].argmax())
            out.append(tok)
            logits = self.forward([tok], state)
            steps.append(logits)
        return out, torch.cat(steps) if steps else logits[:0]
