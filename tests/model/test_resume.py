"""Warm == cold through the unified path: V4Mini resumed by the CacheManager at H' gives the
bits of hybridkv.engine.verify.cold_logits (see hybridkv.model.resume).

The resumed requests run in a manager whose free blocks are NaN-filled before the restore, so
a missing object, a wrong block table or a read of a row nobody wrote poisons the logits; the
negative controls overwrite one snapshot object through the manager's pool tensors between
capture and resume and must be reported as mismatches.
"""
import pytest
import torch

from hybridkv.engine.verify import cold_logits
from hybridkv.model import V4Mini
from hybridkv.model.resume import (CUDA_CHUNKING_TOL, SUBSET, _run_tokens, aligned, check_grid,
                                   greedy_resume, grid_lengths, make_cache, overwrite_snapshot,
                                   poison_free, prompt_tokens, resume_case, serve)

# a module fixture is built once per xdist worker: the whole module runs on one (loadgroup)
pytestmark = pytest.mark.xdist_group("test_resume")


@pytest.fixture(scope="module")
def model():
    return V4Mini(seed=0, backend="torch")


def test_grid_covers_the_boundaries(model):
    c, lengths = model.cfg, grid_lengths(model.cfg)
    edges = [c.csa_ratio, c.hca_ratio, c.window, c.swa_block, c.comp_block * c.csa_ratio,
             c.comp_block * c.hca_ratio, 12, 48, 64, 96, 192, 288, 384]
    for edge in edges:
        assert {edge - 1, edge, edge + 1} <= set(lengths), edge
    assert (min(lengths), max(lengths)) == (3, 385)


def test_resume_points_are_granule_aligned(model):
    gran = model.layout().granule
    assert gran == 2
    assert [aligned(H, gran) for H in (3, 4, 5, 96, 97, 385)] == [2, 4, 4, 96, 96, 384]


def test_resume_grid_torch_subset(model):
    res = check_grid(model, SUBSET)
    assert res.mismatches == 0, res.bad
    assert res.aligned == res.resumed_at == [aligned(H, 2) for H in SUBSET]
    assert all(c.reuse == c.aligned and c.equal for c in res.cases)


@pytest.mark.slow
def test_resume_grid_torch_full(model):
    lengths = grid_lengths(model.cfg)
    res = check_grid(model, lengths)
    assert res.mismatches == 0, res.bad
    assert res.lengths == lengths


def test_resume_grid_triton_small():
    res = check_grid(V4Mini(seed=0, backend="triton"), [5, 10], span=4)
    assert res.mismatches == 0, res.bad


@pytest.mark.slow
def test_resume_grid_triton_full():
    m = V4Mini(seed=0, backend="triton")
    res = check_grid(m, grid_lengths(m.cfg))
    assert res.mismatches == 0, res.bad


@pytest.mark.parametrize("H,prompt", [(4, 9), (8, 9), (17, 23), (33, 40)])
def test_greedy_identical(model, H, prompt):
    g = greedy_resume(model, H, prompt, new_tokens=6)
    assert g.H == g.aligned == aligned(H, 2) and g.ok
    assert g.cold_tokens == g.resumed_tokens and g.logits_equal and g.cold_ref_equal


def test_greedy_identical_triton():
    g = greedy_resume(V4Mini(seed=0, backend="triton"), 9, 12, new_tokens=3)
    assert g.ok, g
    assert g.cold_ref_tol == 0.0 and g.cold_ref_max_abs_diff == 0.0 and g.cold_ref_equal


def test_greedy_ok_needs_the_cold_reference_within_its_tolerance(model):
    g = greedy_resume(model, 9, 12, new_tokens=3)
    assert g.ok and g.cold_ref_tol == 0.0            # on the CPU: bitwise
    assert not g._replace(cold_ref_max_abs_diff=1e-7).ok
    assert g._replace(cold_ref_max_abs_diff=1e-6, cold_ref_tol=CUDA_CHUNKING_TOL).ok
    assert not g._replace(cold_ref_max_abs_diff=1e-4, cold_ref_tol=CUDA_CHUNKING_TOL).ok
    assert not g._replace(logits_equal=False, cold_ref_tol=CUDA_CHUNKING_TOL).ok


# -- negative controls: a test that can fail -------------------------------------------------------
@pytest.mark.parametrize("kind,group,H", [
    ("tail", "csa", 10), ("tail", "hca", 10), ("swa", "swa", 12), ("swa", "hca", 34),
    ("idx", "csa", 34), ("comp", "hca", 10)])
def test_overwritten_snapshot_is_a_mismatch(model, kind, group, H):
    """The snapshot object at H' overwritten between capture and resume: the plan still
    resumes at H' (the bookkeeping cannot see it), the logits differ from cold."""
    touched = []
    res = check_grid(model, [H], span=6,
                     tamper=lambda c, p: touched.append(overwrite_snapshot(c, p, kind, group)))
    assert touched and touched[0] is not None
    assert res.mismatches == 1
    (case,) = res.bad
    assert case.reuse == case.aligned == H and not case.equal and case.max_abs_diff > 0
    assert check_grid(model, [H], span=6).mismatches == 0        # the control passes


def test_an_empty_hca_tail_is_no_checkpoint_object(model):
    """On the HCA ratio's boundary the tail holds no rows (spec.common.tail_need), so a
    checkpoint there has no HCA tail: the resume writes into a fresh, NaN-poisoned working
    tail and still gives the cold bits.  The CSA tail (its overlap rows) stays, and off the
    boundary the HCA tail is read as before."""
    ratio = model.cfg.hca_ratio
    seen = {}

    def exact_kinds(cache, plan):
        seen[plan.reuse_tokens] = {(r.kind, r.group) for r in plan.reads.exact_refs()}
    on, off = 2 * ratio, 2 * ratio + 2
    res = check_grid(model, [on, off], span=6, tamper=exact_kinds)
    assert res.mismatches == 0, res.bad
    assert ("tail", "hca") not in seen[on] and ("tail", "csa") in seen[on]
    assert {("tail", "hca"), ("tail", "csa")} <= seen[off]
    layout = model.layout()
    assert [o.kind for o in layout.exact_at(on) if o.group == "hca"] == ["comp", "swa"]
    assert [o.kind for o in layout.exact_at(off) if o.group == "hca"] == ["comp", "tail", "swa"]


def test_nan_snapshot_is_a_mismatch(model):
    nan = lambda t: torch.full_like(t, float("nan"))      # noqa: E731
    res = check_grid(model, [16], span=4,
                     tamper=lambda c, p: overwrite_snapshot(c, p, "tail", "csa", nan))
    assert res.mismatches == 1 and res.bad[0].max_abs_diff == float("inf")


def test_missing_checkpoint_is_reported(model):
    """A cache without the snapshot at H' (no every_n): the plan resumes elsewhere, which the
    grid reports instead of comparing other positions."""
    prefix = prompt_tokens(model.cfg, 20)
    cache = make_cache(model, [20, 64])
    serve(model, cache, "p", prefix)                  # leaves only its end / repeat points
    case = resume_case(model, cache, prefix, 10, 4)
    assert case.aligned == 10 and case.reuse != 10 and not case.ok


def test_poison_fills_only_free_blocks(model):
    cache = make_cache(model, [40])
    serve(model, cache, "p", prompt_tokens(model.cfg, 30))
    held = {pk: [b for b in range(p.n) if not p.is_free[b]] for pk, p in cache.pools.items()}
    before = {pk: [t[:, p.phys[b]].clone() for t in p.data.values() for b in held[pk]]
              for pk, p in cache.pools.items()}
    poison_free(cache)
    for pk, p in cache.pools.items():
        after = [t[:, p.phys[b]] for t in p.data.values() for b in held[pk]]
        assert all(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
                   for a, b in zip(after, before[pk]))
        for b in range(p.n):
            if p.is_free[b]:
                assert all(t[:, p.phys[b]].isnan().all() for t in p.data.values())


# -- the model over the manager ------------------------------------------------------------------
def test_chunking_changes_no_bits(model):
    toks = prompt_tokens(model.cfg, 40)
    outs = [cold_logits(model, toks, chunk) for chunk in (1, 5, 40)]
    assert torch.isfinite(outs[0]).all()
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def test_backends_agree(model):
    toks = prompt_tokens(model.cfg, 14)
    a = cold_logits(model, toks, 5)
    b = cold_logits(V4Mini(seed=0, backend="triton"), toks, 5)
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_sliding_window_releases_pages(model):
    cache = make_cache(model, [48])
    toks = prompt_tokens(model.cfg, 40)
    cache.lookup("r", toks)
    _run_tokens(model, cache, "r", toks, 0, 8)
    c = model.cfg
    for g in cache.layout.groups:
        pages = cache.tables("r")[g.name].swa
        held = [b for b in pages if b >= 0]
        assert pages[0] == -1 and len(held) <= 2, (g.name, pages)
    assert c.window == 10
    cache.free("r")


def test_device_cold_reference_is_cold_logits(model):
    """The cold run used for a model off the CPU (a fresh manager on the model's device,
    served like any request) is the very bits of verify.cold_logits."""
    toks = prompt_tokens(model.cfg, 37)
    served = serve(model, make_cache(model, [37]), "c", toks, 8)[2]
    assert torch.equal(served, cold_logits(model, toks))
