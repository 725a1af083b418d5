"""V4Mini resumed from a checkpoint at H equals the cold run, bit for bit, with the same chunking.

The resumed run restores into a different cache (NaN-filled pools, other physical blocks), so a
missing object, a wrong block table or a read outside the window changes or poisons the logits.
"""
import pytest
import torch

from hybridkv.model import CheckpointIncomplete, SeqState, Tail, V4Mini
from hybridkv.model.resume import (check_grid, greedy_resume, grid_lengths, prompt_tokens,
                                   schedule)


@pytest.fixture(scope="module")
def model():
    return V4Mini(seed=0, backend="torch")


def test_grid_covers_the_boundaries(model):
    c, lengths = model.cfg, grid_lengths(model.cfg)
    for edge in (c.csa_ratio, c.hca_ratio, c.window, c.swa_block, c.comp_block * c.hca_ratio, 96):
        assert {edge - 1, edge, edge + 1} <= set(lengths)
    assert max(lengths) >= 90


def test_resume_grid_torch(model):
    res = check_grid(model, grid_lengths(model.cfg))
    assert res.mismatches == 0, res.bad


def test_resume_grid_triton_subset():
    res = check_grid(V4Mini(seed=0, backend="triton"), [3, 4, 5, 9, 11, 16, 17], span=6)
    assert res.mismatches == 0, res.bad


@pytest.mark.slow
def test_resume_grid_triton_full():
    m = V4Mini(seed=0, backend="triton")
    assert check_grid(m, grid_lengths(m.cfg)).mismatches == 0


@pytest.mark.parametrize("H,prompt", [(4, 9), (8, 9), (17, 23), (33, 40)])
def test_greedy_identical(model, H, prompt):
    g = greedy_resume(model, H, prompt, new_tokens=6)
    assert g.cold_tokens == g.resumed_tokens and g.logits_equal


def test_greedy_identical_triton():
    g = greedy_resume(V4Mini(seed=0, backend="triton"), 13, 16, new_tokens=3)
    assert g.cold_tokens == g.resumed_tokens and g.logits_equal


def _cold_and_ckpt(model, H, extra):
    toks = prompt_tokens(model.cfg, H + extra)
    st = SeqState(model.new_cache())
    model.prefill(toks[:H], st, 8)
    ckpt = st.checkpoint()
    return toks, ckpt, model.prefill(toks[H:], st, 8)


def _bump(t, g):
    return t + torch.randn(t.shape, generator=g)


@pytest.mark.parametrize("obj", ["swa_rows", "comp", "idx", "tail", "idx_tail"])
def test_every_object_matters(model, obj):
    """Negative control: perturbing any one object of the checkpoint changes the logits."""
    H = 17
    toks, ckpt, cold = _cold_and_ckpt(model, H, 16)
    g = torch.Generator().manual_seed(0)
    layers = []
    for lc in ckpt.layers:
        v = getattr(lc, obj)
        if isinstance(v, Tail):
            v = Tail(v.start, _bump(v.kv, g), _bump(v.gate, g))
        elif v is not None:
            v = _bump(v, g)
        layers.append(lc._replace(**{obj: v}))
    st = SeqState.restore(model.new_cache(), ckpt._replace(layers=tuple(layers)))
    assert not torch.equal(model.prefill(toks[H:], st, 8), cold)


def test_incomplete_checkpoint_refused(model):
    _, ckpt, _ = _cold_and_ckpt(model, 17, 1)
    lc = ckpt.layers[1]
    short = lc._replace(tail=Tail(lc.tail.start + 1, lc.tail.kv[1:], lc.tail.gate[1:]))
    cache = model.new_cache()
    free = {k: list(v) for k, v in cache.free_blocks.items()}
    with pytest.raises(CheckpointIncomplete) as e:
        SeqState.restore(cache, ckpt._replace(layers=(ckpt.layers[0], short, *ckpt.layers[2:])))
    assert e.value.what == "layer1.tail" and e.value.value == (len(lc.tail.kv) - 1, len(lc.tail.kv))
    assert cache.free_blocks == free


def test_chunking_changes_nothing_but_rounding(model):
    toks = prompt_tokens(model.cfg, 40)
    outs = []
    for chunk in (1, 5, 40):
        st = SeqState(model.new_cache())
        outs.append(model.prefill(toks, st, chunk))
    assert torch.isfinite(outs[0]).all()
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


def test_backends_agree(model):
    toks = prompt_tokens(model.cfg, 26)
    tri = V4Mini(seed=0, backend="triton")
    a = model.prefill(toks, SeqState(model.new_cache()), 9)
    b = tri.prefill(toks, SeqState(tri.new_cache()), 9)
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_sliding_window_releases_blocks(model):
    st = SeqState(model.new_cache())
    model.prefill(prompt_tokens(model.cfg, 40), st, 8)
    held = [b for b in st.layers[0].swa if b >= 0]
    c = model.cfg
    assert len(held) <= -(-(c.window + c.swa_block) // c.swa_block)
    assert st.layers[0].swa[0] == -1


def test_schedule_cuts():
    assert schedule(3, 20, 8, [5, 17]) == [(3, 5), (5, 8), (8, 16), (16, 17), (17, 20)]
