"""Bookkeeping bytes per block (hybridkv.bench.footprint): the meter sees a known object and
not torch's tensor storage, vllm_side.py's twins measure alike, each side's count grows linearly
with the blocks it is built with, and vs-vllm's ratios come from the two sides' numbers.  The
vLLM side runs only when the vLLM venv exists (skipped with the reason otherwise)."""
import ast
import gc
import tracemalloc

import pytest

from hybridkv.bench import footprint, hybridkv_side, vs_vllm
from hybridkv.bench.vllm_streams import SCRIPT, run_vllm_side, tiny_stream, write_stream

from .test_vs_vllm import tiny_job

MIB = 2 ** 20


def vllm_twins() -> dict:
    """vllm_side.py's HeapMeter and footprint_summary, run from its source (it cannot be
    imported here: it imports vllm)."""
    tree = ast.parse(open(SCRIPT).read())
    nodes = [n for n in tree.body if getattr(n, "name", None) in ("HeapMeter",
                                                                  "footprint_summary")]
    space = {"gc": gc, "tracemalloc": tracemalloc}
    exec(compile(ast.Module(nodes, []), SCRIPT, "exec"), space)
    return space


@pytest.mark.parametrize("meter", [footprint.HeapMeter, vllm_twins()["HeapMeter"]],
                         ids=["hybridkv", "vllm_side"])
def test_meter_sees_a_known_object_and_its_release(meter):
    with meter() as m:
        kept = bytearray(MIB)
        held = m.held()
        gone = bytearray(MIB)
        del gone
        after = m.held()
    assert MIB <= held < MIB + 4096
    assert abs(after - held) < 4096
    assert len(kept) == MIB and not tracemalloc.is_tracing()


def test_meter_does_not_see_tensor_storage():
    """torch's allocator is outside tracemalloc: a CPU tensor counts its Python object only."""
    import torch
    with footprint.HeapMeter() as m:
        t = torch.empty(8 * MIB, dtype=torch.uint8)
        held = m.held()
    assert t.numel() == 8 * MIB and held < 4096


def test_vllm_side_summary_is_the_twin():
    twin = vllm_twins()["footprint_summary"]
    for args in [(400, 16, 79801, 98617), (65536, 0, 10 ** 7, 10 ** 7), (7, 3, 100, 250)]:
        assert twin(*args) == footprint.summary(*args)
    assert footprint.summary(10, 0, 1000, 1000)["added_per_cached_block"] is None
    s = footprint.summary(400, 16, 80000, 96000)
    assert (s["built_per_block"], s["stream_per_block"], s["added_per_cached_block"]) == \
        (200.0, 240.0, 1000.0)


def linear(built: dict) -> tuple:
    """(bytes per block added from n to 2n, from 2n to 4n) of {blocks: built_bytes}."""
    n1, n2, n4 = sorted(built)
    return (built[n2] - built[n1]) / (n2 - n1), (built[n4] - built[n2]) / (n4 - n2)


def test_hybridkv_footprint_linear_in_blocks(tmp_path):
    """Built at 500, 1000 and 2000 blocks (full layout): every block adds the same bytes; the
    stream adds bytes for the blocks it leaves cached; no KV storage is counted (pools on the
    meta device: 2000 blocks of 4 KiB would be 8 MiB)."""
    job = tiny_job("full")
    built = {}
    for n in (500, 1000, 2000):
        job["file"]["hybridkv"]["num_blocks"] = {"comp/full": n}
        path = tmp_path / f"s{n}.json"
        write_stream(str(path), job["file"])
        out = hybridkv_side.footprint(*hybridkv_side.load_stream(str(path)))
        assert out["side"] == "hybridkv" and out["device"] == "meta"
        assert out["num_blocks"] == n and out["cached_blocks"] > 0
        assert out["stream_bytes"] > out["built_bytes"] and out["added_per_cached_block"] > 0
        built[n] = out["built_bytes"]
    low, high = linear(built)
    assert 20 < low < 2000 and high == pytest.approx(low, rel=0.1)
    assert built[2000] < 2000 * 4096 / 4


def test_footprint_ratios_from_both_sides():
    hk = footprint.summary(500, 10, 100_000, 150_000)
    vl = footprint.summary(400, 20, 50_000, 60_000)
    assert vs_vllm.footprint_ratios(hk, vl) == {"built_per_block": 1.6,
                                                 "stream_per_block": 2.0, "stream_bytes": 2.5}
    lines = vs_vllm.footprint_lines({"hybridkv": hk, "vllm": vl,
                                     "ratios": vs_vllm.footprint_ratios(hk, vl)})
    assert "200.0 /    300.0 B  (500 blocks, 10 cached" in lines[1]
    assert "1.600 /    2.000" in lines[3] and vs_vllm.footprint_lines({}) == []


def test_hybridkv_side_footprint_process(tmp_path):
    path = tmp_path / "s.json"
    write_stream(str(path), tiny_job("v4-mini")["file"])
    out = vs_vllm.run_hybridkv_side(str(path), timeout_s=120, footprint=True)
    assert out["num_blocks"] == sum(tiny_job("v4-mini")["file"]["hybridkv"]["num_blocks"]
                                    .values())
    assert out["stream_per_block"] > out["built_per_block"] > 0


@pytest.mark.slow     # ~40 s of vLLM-venv runs at growing sizes
def test_vllm_footprint_linear_in_blocks(vllm_python, tmp_path):
    """vLLM's manager at 500, 1000 and 2000 blocks: every KVCacheBlock adds the same bytes; the
    stream leaves hashed blocks that add bytes."""
    built = {}
    for n in (500, 1000, 2000):
        path = tmp_path / f"s{n}.json"
        write_stream(str(path), tiny_stream("full", "decode", decode_steps=20, num_blocks=n))
        out = run_vllm_side(vllm_python, str(path), timeout_s=300, footprint=True)
        assert out["side"] == "vllm" and out["num_blocks"] == n
        assert out["cached_blocks"] > 0 and out["stream_bytes"] > out["built_bytes"]
        built[n] = out["built_bytes"]
    low, high = linear(built)
    assert 20 < low < 2000 and high == pytest.approx(low, rel=0.1)
