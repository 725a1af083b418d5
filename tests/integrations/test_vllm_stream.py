"""The stream tier: the stream / DeepSeek-V4 checks on vLLM's real Scheduler under the vLLM venv
(tests/integrations/stream_checks.py; skipped, with the reason, when the venv from
scripts/vllm_venv is absent: set HYBRIDKV_VLLM_PYTHON or create ../vllm-venv)."""
import os
import subprocess

import pytest

from hybridkv.bench.vllm_streams import find_vllm_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(REPO, "tests", "integrations", "stream_checks.py")


@pytest.mark.slow     # ~30 s in the vLLM venv (vLLM's Scheduler, both managers, 3 shapes)
def test_stream_and_v4_on_vllms_scheduler():
    py = find_vllm_python()
    if py is None:
        pytest.skip("no vLLM venv (scripts/vllm_venv ../vllm-venv, or HYBRIDKV_VLLM_PYTHON)")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1",
               VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH=REPO)
    # -o addopts=: the repo's addopts (-n 2) name xdist, which the vLLM venv lacks
    out = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                          "-o", "addopts=", "--rootdir", os.path.dirname(CHECKS), CHECKS],
                         cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
