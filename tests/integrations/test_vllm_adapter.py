"""hybridkv's vLLM adapter: import isolation (always), and its checks on vLLM's real objects
under the vLLM venv (tests/integrations/adapter_checks.py; skipped, with the reason, when the
venv from scripts/vllm_venv is absent: set HYBRIDKV_VLLM_PYTHON or create ../vllm-venv)."""
import os
import subprocess
import sys

import pytest

from hybridkv.bench.vllm_streams import find_vllm_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(REPO, "tests", "integrations", "adapter_checks.py")


def test_import_hybridkv_never_imports_vllm():
    code = ("import sys, hybridkv, hybridkv.cache, hybridkv.integrations.vllm\n"
            "from hybridkv import ModelLayout\n"
            "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


@pytest.mark.slow           # ~50 s in the vLLM venv: the adapter tier, `pytest -m slow`
def test_adapter_on_vllm_objects():
    py = find_vllm_python()
    if py is None:
        pytest.skip("no vLLM venv (scripts/vllm_venv ../vllm-venv, or HYBRIDKV_VLLM_PYTHON)")
    probe = subprocess.run([py, "-c", "import hybridkv.integrations.vllm.manager"], cwd="/",
                           capture_output=True, timeout=300)
    if probe.returncode:
        pytest.skip("the vLLM venv has no hybridkv: run scripts/vllm_venv")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    # -o addopts=: the repo's addopts (-n 2) name xdist, which the vLLM venv lacks
    out = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                          "-o", "addopts=", "--rootdir", os.path.dirname(CHECKS), CHECKS],
                         cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
