"""Warm == cold through the unified path: resuming at a cached H gives the cold run's bits.

Everything runs the way an engine runs it, over one memory: the model reads and writes the
CacheManager's pool tensors, the manager decides every reuse (``lookup`` -> ``HitPlan``), and a
resumed request computes only positions [plan.reuse_tokens, ...).

Resume grid (``check_grid``): per grid length H, the resume point is H' = the largest multiple
of the hash granule <= H (hits sit on the granule: 2 tokens for v4-mini; ``aligned``).
  1. one *prefix* request computes T[:max H' + granule] in a manager with ``every_n=granule``:
     a snapshot at every aligned position (commits end on each, so its chunks are <= granule);
  2. per H' a *branch* request looks up T[:H'] + ``span`` fresh tokens (the first differs from
     T[H'], so no longer checkpoint of T matches): the plan must resume at exactly H'; the
     manager copies the snapshots at H' into the request's working blocks, and the request
     computes its span in engine-style chunks (``chunk``, split at its own checkpoints);
  3. its logits must be ``torch.equal`` to ``hybridkv.engine.verify.cold_logits`` of the same
     tokens (a fresh manager, chunks of 8 from position 0) at the same positions.
Before every branch's first allocation the blocks the manager holds FREE are filled with NaN
(``poison``): a read of a row nobody wrote for this request (stale data of a recycled block)
poisons the logits instead of passing by luck.  ``tamper(cache, plan)`` runs between the
lookup and the allocation (after capture, before the restore): a negative control overwrites a
snapshot there (``overwrite_snapshot``) and must be reported as a mismatch.

Greedy (``greedy_resume``): a first request of length H'+1 leaves its "repeat" checkpoint at H';
a second request with a longer prompt resumes there, prefills and decodes greedily (allocate 1 /
commit 1 per token); a cold generation (fresh manager, nothing reused) must produce the same
tokens and the same logits bits, and both equal ``cold_logits`` of the final sequence (prefill
chunks of 8 where the generation ran one token a step).  That last comparison is bitwise on the
CPU; on CUDA it allows ``CUDA_CHUNKING_TOL``: cuBLAS picks its kernel by the number of rows, so
one decode token and a chunk of 8 round differently in both backends (1.2e-6 measured on an
H200, the resume itself bitwise), and batch invariance is no property this check is about.
Both backends: the model's (``V4Mini(backend="torch"|"triton")``).
"""
import time
from typing import NamedTuple

import torch

from hybridkv.model.v4mini import SeqWork

SUBSET = (3, 4, 5, 9, 10, 11, 15, 16, 17, 31, 32, 33, 95, 96, 97)
TRITON_SUBSET = (3, 4, 5, 9, 10, 11, 16, 17)
MAX_LEN = 385
CUDA_CHUNKING_TOL = 1e-5   # greedy's cold reference on CUDA: chunk of 8 vs one token a step


class Case(NamedTuple):
    """One resume: grid length H, intended resume point H' (aligned), the plan's H, whether
    the logits are bitwise the cold run's, max |warm - cold| (NaN counted as inf)."""
    H: int
    aligned: int
    reuse: int
    equal: bool
    max_abs_diff: float

    @property
    def ok(self):
        return self.equal and self.reuse == self.aligned


class GridResult(NamedTuple):
    backend: str
    lengths: list
    aligned: list           # H' per length (same order): the intended resume point
    resumed_at: list        # the plan's H per length (== aligned unless a mismatch)
    mismatches: int         # lengths whose case is not ok
    bad: list               # Case for every mismatching length
    span: int
    seconds: float
    cases: list             # Case per length


class GreedyResult(NamedTuple):
    H: int                  # resume point the plan chose
    aligned: int            # the intended one, H' = aligned(H requested)
    cold_tokens: list
    resumed_tokens: list
    logits_equal: bool      # resumed vs cold generation, positions [H, end)
    cold_ref_equal: bool    # both vs verify.cold_logits of the final sequence, bitwise
    cold_ref_max_abs_diff: float    # the same comparison's largest difference
    cold_ref_tol: float     # what ok allows of it: 0 on the CPU, CUDA_CHUNKING_TOL on CUDA

    @property
    def ok(self):
        return self.H == self.aligned and self.cold_tokens == self.resumed_tokens and \
            self.logits_equal and self.cold_ref_max_abs_diff <= self.cold_ref_tol


# -- the grid -----------------------------------------------------------------------------------
def aligned(H, granule):
    """The resume point a length H can have: the largest multiple of ``granule`` <= H."""
    return H - H % granule


def grid_lengths(cfg, max_len=MAX_LEN, longer=(128, 200, 256, 320)):
    """m-1, m, m+1 around: each compression ratio, the window, every multiple of each group's
    block size (SWA 6, CSA 16, HCA 32) up to the LCM (96), every multiple of the LCM up to
    ``max_len`` and ``longer``; lengths whose resume point would be 0 are left out."""
    from hybridkv.layout import ModelLayout
    lay = ModelLayout.from_model(cfg)
    pts = {cfg.csa_ratio, cfg.hca_ratio, cfg.window, *longer}
    for g in lay.groups:
        pts |= set(range(g.block_size, lay.lcm + 1, g.block_size))
    pts |= set(range(lay.lcm, max_len + 1, lay.lcm))
    out = {h + d for h in pts for d in (-1, 0, 1)}
    return sorted(h for h in out if aligned(h, lay.granule) > 0 and h <= max_len)


def prompt_tokens(cfg, n, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (n,), generator=g).tolist()


def branch_tokens(prefix, H, span, vocab, seed=7):
    """``span`` tokens to follow prefix[:H]; the first differs from prefix[H]."""
    g = torch.Generator().manual_seed(seed * 100003 + H)
    rest = torch.randint(0, vocab, (span,), generator=g).tolist()
    if H < len(prefix):
        rest[0] = (prefix[H] + 1 + rest[0] % (vocab - 1)) % vocab
    return rest


def make_cache(model, tokens_per_request, every_n=0):
    """A CacheManager on the model's device sized so that nothing is evicted: every request
    of ``tokens_per_request`` (a list, one per request) with all its checkpoints held."""
    from hybridkv.cache import CacheManager
    lay = model.layout()
    sizes = {pk: 8 for pk in lay.pool_keys()}
    for n in tokens_per_request:
        for pk, k in CacheManager.pool_sizes(lay, n, 1, every_n).items():
            sizes[pk] += k
    return CacheManager(lay, num_blocks=sizes, device=model.device, every_n=every_n)


def poison_free(cache):
    """Fill every FREE block's rows (every tensor, every layer) and the spare slots with NaN."""
    for pool in cache.pools.values():
        slots = [pool.phys[b] for b in range(pool.n) if pool.is_free[b]] + [pool.spare]
        idx = torch.as_tensor(slots, dtype=torch.long, device=cache.device)
        for t in pool.data.values():
            t.index_fill_(1, idx, float("nan"))


def overwrite_snapshot(cache, plan, kind, group, fn=lambda t: t + 1.0):
    """Negative control: rewrite, through the manager's pool tensors, the exact (snapshot)
    object of (kind, group) the plan resumes from, in every layer of the group.  Returns the
    block's slot, or None when the plan reads no such object."""
    reads = [r for r in plan.reads if r.exact and (r.ref.kind, r.ref.group) == (kind, group)]
    if not reads:
        return None
    pool = cache.pools[(kind, group)]
    slot = pool.slot(reads[0].ref.block)
    for layer in cache.layout.group(group).layers:
        for t in cache.layer_pools(layer)[kind].values():
            t[slot] = fn(t[slot])
    return slot


# -- serving one request the engine's way --------------------------------------------------------
def _pins(cache, rid):
    return {g.name: cache.launch_pins(rid, g.name) for g in cache.layout.groups}


def _forward(model, cache, rid, toks, L):
    cache.begin_read(rid)
    w = SeqWork(list(toks), L, cache.tables(rid), _pins(cache, rid), len(toks))
    return model.forward([w], cache)[0]


def _run_tokens(model, cache, rid, toks, L, chunk, ids=None):
    """Compute positions [L, L + len(toks)): allocations of at most ``chunk`` (aligned to
    multiples of ``chunk``), one forward per stretch between the allocation's checkpoints,
    each ended by its commit.  Returns the logits."""
    out, i = [], 0
    while i < len(toks):
        k = min(chunk - L % chunk, len(toks) - i)
        a = cache.allocate(rid, k)
        assert a.start == L, (a.start, L)
        for P in [p for p in a.checkpoints if L < p < a.end] + [a.end]:
            out.append(_forward(model, cache, rid, toks[i:i + P - L], L))
            cache.commit(rid, P - L, None if ids is None else list(toks[i:i + P - L]))
            i, L = i + P - L, P
    return out


def serve(model, cache, rid, tokens, chunk=8, new_tokens=0, before_allocate=None):
    """One request: lookup, (``before_allocate(cache, plan)``), compute the prompt from the
    plan's H, then ``new_tokens`` greedy tokens (decode: allocate 1, commit 1), free.
    Returns (plan, generated tokens, logits of positions [H, len(prompt) + new_tokens - 1))."""
    plan = cache.lookup(rid, tokens)
    if before_allocate is not None:
        before_allocate(cache, plan)
    H = plan.reuse_tokens
    try:
        out = _run_tokens(model, cache, rid, tokens[H:], H, chunk) if H < len(tokens) else []
        gen, L = [], len(tokens)
        if new_tokens:
            if not out:              # a full hit still needs the last position's logits
                raise ValueError("a generation needs at least one prompt token to compute")
            gen.append(int(out[-1][-1].argmax()))
            while len(gen) < new_tokens:
                out += _run_tokens(model, cache, rid, gen[-1:], L, chunk, ids=True)
                L += 1
                gen.append(int(out[-1][-1].argmax()))
    finally:
        cache.free(rid)
    return plan, gen, torch.cat(out) if out else torch.empty(0, model.cfg.vocab)


def _diff(a, b):
    if a.shape != b.shape:
        return float("inf")
    if torch.equal(a, b):
        return 0.0
    return float((a - b).abs().nan_to_num(float("inf")).max())


def cold_reference(model, tokens, chunk=8):
    """``hybridkv.engine.verify.cold_logits`` (a fresh CacheManager, chunks of ``chunk`` from
    position 0).  A model on another device than the CPU gets the same cold run with the
    fresh manager on the model's device: cold_logits builds its CacheManager with the default
    device="cpu", whose pools a CUDA model's launches refuse (check_same_device)."""
    if model.device.type == "cpu":
        from hybridkv.engine.verify import cold_logits
        return cold_logits(model, tokens, chunk)
    cache = make_cache(model, [len(tokens)])
    return serve(model, cache, "cold", tokens, chunk)[2]


def resume_case(model, cache, prefix, H, span, chunk=8, poison=True, tamper=None, rid=None):
    """Resume T[:H'] + branch in ``cache`` (holding a snapshot at H') and compare with cold."""
    Hp = aligned(H, cache.layout.granule)
    toks = prefix[:Hp] + branch_tokens(prefix, Hp, span, model.cfg.vocab)

    def before(c, plan):
        if tamper is not None:
            tamper(c, plan)
        if poison:
            poison_free(c)
    plan, _, warm = serve(model, cache, rid or f"resume{Hp}", toks, chunk, before_allocate=before)
    cold = cold_reference(model, toks)[plan.reuse_tokens:]
    d = _diff(warm, cold)
    return Case(H, Hp, plan.reuse_tokens, d == 0.0, d)


def check_grid(model, lengths, span=12, chunk=8, poison=True, tamper=None, seed=1234):
    """The resume grid over ``lengths`` on the model's backend (see module docstring)."""
    t0 = time.perf_counter()
    gran = model.layout().granule
    lengths = sorted(set(lengths))
    targets = {H: aligned(H, gran) for H in lengths}
    if any(Hp <= 0 for Hp in targets.values()):
        raise ValueError(f"lengths below the granule {gran} cannot resume", lengths)
    resume_points = sorted(set(targets.values()))
    prefix = prompt_tokens(model.cfg, resume_points[-1] + gran, seed)
    branch = span + 2 * max(g.block_size for g in model.layout().groups)
    cache = make_cache(model, [len(prefix)] + [branch] * len(resume_points), every_n=gran)
    plan, _, _ = serve(model, cache, "prefix", prefix, chunk)
    if plan.reuse_tokens:
        raise AssertionError(f"the prefix request of an empty cache hit {plan.reuse_tokens}")
    by_point = {Hp: resume_case(model, cache, prefix, Hp, span, chunk, poison, tamper)
                for Hp in resume_points}
    cases = [by_point[targets[H]]._replace(H=H) for H in lengths]
    bad = [c for c in cases if not c.ok]
    return GridResult(model.backend, lengths, [c.aligned for c in cases],
                      [c.reuse for c in cases], len(bad), bad, span,
                      round(time.perf_counter() - t0, 3), cases)


# -- greedy generation -----------------------------------------------------------------------------
def greedy_resume(model, H, prompt_len, new_tokens=6, chunk=8, seed=99):
    """Greedy generation from a ``prompt_len`` prompt, cold vs resumed from the "repeat"
    checkpoint a first request of length H'+1 left at H' = aligned(H)."""
    gran = model.layout().granule
    Hp = aligned(H, gran)
    if not 0 < Hp < prompt_len:
        raise ValueError("need 0 < H' < prompt_len", (Hp, prompt_len))
    toks = prompt_tokens(model.cfg, prompt_len, seed=seed + H)
    cold_cache = make_cache(model, [prompt_len + new_tokens])
    plan0, cold_tok, cold_lg = serve(model, cold_cache, "cold", toks, chunk, new_tokens)
    assert plan0.reuse_tokens == 0, plan0.reuse_tokens
    cache = make_cache(model, [Hp + 1, prompt_len + new_tokens])
    serve(model, cache, "first", toks[:Hp + 1], chunk)
    plan, res_tok, res_lg = serve(model, cache, "second", toks, chunk, new_tokens,
                                  before_allocate=lambda c, p: poison_free(c))
    H = plan.reuse_tokens
    ref = cold_reference(model, toks + cold_tok[:-1])
    ref_diff = max(_diff(ref, cold_lg), _diff(ref[H:], res_lg))     # 0.0: both torch.equal
    return GreedyResult(H, Hp, cold_tok, res_tok, torch.equal(cold_lg[H:], res_lg),
                        ref_diff == 0.0, ref_diff,
                        CUDA_CHUNKING_TOL if model.device.type == "cuda" else 0.0)

