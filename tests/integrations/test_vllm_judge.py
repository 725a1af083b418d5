"""The judge tier: vLLM 0.33.0's own tests with hybridkv's KVCacheManager (the pytest plugin),
per file; every failure of a test that stock vLLM passes is named in judged.py with the class
of its difference, or is a named refusal (``UnsupportedSpec`` of a spec hybridkv does not
manage).  Slow (~3 min on 2 cores); skipped with the reason without the vLLM venv
(scripts/vllm_venv) or vLLM's tests ($VLLM_TESTS, default ../vllm-tests; the kit
$VLLM_TESTS_KIT, default ../shared/vllm_tests beside the checkout)."""
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from hybridkv.bench.vllm_streams import find_vllm_python
from tests.integrations.judged import CLASSES, NAMED, REFUSED_SPECS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARENT = os.path.dirname(REPO)
# messages of failures that stock vLLM has too on this machine (configuration: model configs
# not in the offline Hugging Face cache, a fixture from vLLM's top-level conftest)
STOCK_CONFIG = ("ValidationError", "fixture 'caplog_vllm' not found")


def failures(junit_xml):
    """test name -> the failure or error message, from a junit XML report."""
    out = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            bad = case.find(kind)
            if bad is not None:
                out[case.get("name")] = (bad.get("message") or "") + (bad.text or "")[-2000:]
    return out


def verdict(found, named):
    """(unexplained failures, named tests that passed) of one file's failures ``found`` given
    its ``named`` ones: refusals and stock configuration failures are explained."""
    def explained(msg):
        return any(s in msg for s in STOCK_CONFIG) or ("UnsupportedSpec" in msg and any(
            spec in msg for spec in REFUSED_SPECS))
    return sorted(n for n, msg in found.items() if n not in named and not explained(msg)), \
        sorted(n for n in named if n not in found)


def test_every_named_failure_has_a_known_class():
    assert {c for names in NAMED.values() for c in names.values()} <= set(CLASSES)


def test_the_verdict_separates_named_refused_and_new_failures():
    named = {"a": "id-order"}
    found = {"a": "assert 1 == 2", "b": "UnsupportedSpec: {'spec': 'MambaSpec'}",
             "c": "UnsupportedSpec: {'spec': 'FullAttentionSpec'}", "d": "ValidationError"}
    assert verdict(found, named) == (["c"], [])
    assert verdict({}, named) == ([], ["a"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMED))
def test_vllm_tests_fail_only_where_named(name, tmp_path):
    py = find_vllm_python()
    tests = os.environ.get("VLLM_TESTS") or os.path.join(PARENT, "vllm-tests")
    kit = os.environ.get("VLLM_TESTS_KIT") or os.path.join(PARENT, "shared", "vllm_tests")
    if py is None:
        pytest.skip("no vLLM venv (scripts/vllm_venv ../vllm-venv, or HYBRIDKV_VLLM_PYTHON)")
    if not os.path.isdir(os.path.join(tests, "tests", "v1", "core")) or \
            not os.path.isfile(os.path.join(kit, "run")):
        pytest.skip("no vLLM tests: ../shared/vllm_tests/get_tests ../vllm-tests")
    report = tmp_path / "judge.xml"
    env = dict(os.environ, PYTHONPATH=REPO)
    subprocess.run([os.path.join(kit, "run"), py, tests, f"tests/v1/core/{name}", "-p",
                    "hybridkv.integrations.vllm.pytest_plugin", "--tb=short",
                    f"--junitxml={report}"], env=env, capture_output=True, timeout=900)
    new, fixed = verdict(failures(report), NAMED[name])
    assert (new, fixed) == ([], []), f"unexplained failures {new}; named tests passing {fixed}"
