"""The judge tier's gate (scripts/vllm_gate.py) on made-up pytest logs: it fails on any failure
not named with a reason, refuses a log where the plugin was not active, and names stale entries."""
import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "vllm_gate.py"
spec = importlib.util.spec_from_file_location("vllm_gate", PATH)
vllm_gate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_gate)

EXPECTED = """
# comment
tests/v1/core/test_scheduler.py::test_mm[*] | stock fails too: model config not in hf/
tests/v1/core/test_scheduler.py::test_mamba | ours: Mamba is not a hybridkv kind (UnsupportedSpec)
"""


def log(*outcomes, passed=5, header=True):
    lines = ([vllm_gate.HEADER] if header else []) + ["collected 9 items", "..F.."]
    lines += [f"{kind} {node} - AssertionError: x" for kind, node in outcomes]
    lines.append(f"==== {len(outcomes)} failed, {passed} passed in 3.2s ====")
    return "\n".join(lines)


def test_expected_failures_pass_the_gate_and_stale_entries_are_named():
    expected = vllm_gate.read_expected(EXPECTED)
    ok, lines = vllm_gate.gate(expected, [log(
        ("FAILED", "tests/v1/core/test_scheduler.py::test_mm[a-1]"),
        ("ERROR", "tests/v1/core/test_scheduler.py::test_mm[b-2]"))])
    assert ok, lines
    assert any("now passing" in line and "test_mamba" in line for line in lines)


def test_an_unnamed_failure_fails_the_gate():
    expected = vllm_gate.read_expected(EXPECTED)
    ok, lines = vllm_gate.gate(expected, [log(
        ("FAILED", "tests/v1/core/test_scheduler.py::test_mamba"),
        ("FAILED", "tests/v1/core/test_prefix_caching.py::test_new_regression"))])
    assert not ok
    assert "  UNEXPECTED tests/v1/core/test_prefix_caching.py::test_new_regression" in lines


def test_a_log_without_the_plugin_or_without_passes_is_refused():
    expected = vllm_gate.read_expected(EXPECTED)
    with pytest.raises(vllm_gate.GateError):
        vllm_gate.gate(expected, [log(header=False)])
    ok, _ = vllm_gate.gate(expected, [log(passed=0)])
    assert not ok


def test_an_entry_without_a_reason_is_refused():
    with pytest.raises(vllm_gate.GateError) as e:
        vllm_gate.read_expected("tests/v1/core/test_x.py::test_y\n")
    assert "test_y" in str(e.value.value)
