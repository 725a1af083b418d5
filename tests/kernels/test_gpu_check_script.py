"""scripts/gpu_check.py runs only on a GPU machine; here: it parses, imports, and its
CPU-safe decode-graph part (DecodeGraph over the CacheManager's pool tensors, eager on CPU)
passes its own acceptance rule."""
import ast
import importlib.util
from pathlib import Path

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
