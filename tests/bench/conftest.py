"""The benchmark tests' vLLM python: the tests that run vLLM's side are skipped, with the reason,
when the vLLM environment is absent or cannot import vllm (set HYBRIDKV_VLLM_PYTHON or create
../vllm-venv with scripts/vllm_venv)."""
import pytest

from hybridkv.bench.vs_vllm import vllm_status


@pytest.fixture(scope="module")
def vllm_python():
    python, reason = vllm_status()
    if python is None:
        pytest.skip(reason)
    return python
