"""scripts/gpu_check.py runs only on a GPU machine; here: it parses, imports, without CUDA
prints one JSON object saying so (exit 2), its decode inputs are a valid decode step, and its
CPU-safe decode-graph part (DecodeGraph over the CacheManager's pool tensors, eager on CPU)
passes its own acceptance rule."""
import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parses_and_imports():
    ast.parse(SCRIPT.read_text())
    mod = _load()
    assert callable(mod.main) and callable(mod.decode_graph_check)


def test_decode_graph_part_on_cpu():
    mod = _load()
    g = mod.decode_graph_check(torch.device("cpu"), "torch", new_tokens=3, prompt_len=13)
    assert g["cuda"] is False and mod._decode_graph_ok(g), g


def test_without_cuda_one_json_object_and_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the script runs the GPU check instead")
    mod = _load()
    assert mod.main(["--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["cuda_available"] is False and "no CUDA" in out["error"]


@pytest.mark.parametrize("mode,ratio", [("swa", 4), ("sparse", 4), ("hca", 8), ("hca", 64)])
def test_decode_inputs_are_a_valid_decode_step(mode, ratio):
    """The bandwidth / graph inputs (kernels.shapes.decode_inputs): every read the kernel
    makes is held, and the kernel equals the reference on them (interpreted here)."""
    from kernels.attention import attention
    from kernels.shapes import DEEPSEEK_V4, decode_inputs
    small = DEEPSEEK_V4._replace(n_heads=4, head_dim=16, window=20, swa_rows=16, comp_rows=8,
                                 top_k=8)
    q, swa, comp, plan, sink, n_ent = decode_inputs(small, 3, 200, ratio)
    assert n_ent == 200 // ratio and tuple(plan.sel.shape) == (3, 8)
    assert int((plan.sel >= 0).sum()) == 3 * min(8, n_ent)
    got, want = (attention(mode, q, swa, plan, sink, 20, comp_pool=comp, ratio=ratio,
                           backend=be) for be in ("triton", "torch"))
    assert float((got - want).abs().max()) <= 1e-5
