"""Project hygiene. No tracked file names an absolute path of one machine (a home, a workspace,
a mount): the project must run from any checkout or install (example paths under /tmp and system
paths such as /usr/bin/env are not machine paths). A test run's output ends with pytest's
summary line, even when Triton's bindings report leaks at teardown (tests/conftest.py)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# A path segment after a leading "/" (or "~/") that only exists on some machines. Spelled as a
# pattern so that this file does not match itself.
MACHINE_ROOTS = ("work", "root", "home", "Users", "mnt", "scratch", "data", "workspace")
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:" + "|".join(MACHINE_ROOTS) + r")/[\w.-]"
                          r"|[A-Za-z]:\\(?:Users|work)\\")


def machine_paths(text: str) -> list:
    """The machine paths in `text` as (line number, line)."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATH.search(line)]


def tracked_text_files() -> list:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    files = []
    for name in filter(None, names):
        path = REPO / name
        if not path.is_file():
            continue                      # deleted in the working tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue                      # binary (the shipped traces are gzip)
        files.append((name, data.decode("utf-8", errors="replace")))
    return files


@pytest.mark.parametrize("text, found", [
    ("trace = '/" + "work/shared/traces/x.jsonl.gz'", True),
    ("# Recipe: /" + "root/notes.md", True),
    ("see /" + "home/alice/venv", True),
    ("cd /" + "Users/bob/src", True),
    ("C:\\" + "Users\\bob\\src", True),
    ("python -m x -o /tmp/s.json", False),
    ("#!/usr/bin/env bash", False),
    ("../vllm-venv/bin/python", False),
    ("hybridkv/bench/data/mooncake_conversation", False),
    ("a/" + "work/b (relative)", False),
])
def test_the_pattern(text, found):
    assert bool(machine_paths(text)) is found


def test_no_tracked_file_names_a_machine_path():
    offenders = [f"{name}:{n}: {line}" for name, text in tracked_text_files()
                 for n, line in machine_paths(text)]
    assert not offenders, "absolute machine paths:\n" + "\n".join(offenders)


# -- the end of a test run ----------------------------------------------------------------------
LEAKY_TESTS = """
import ctypes

from triton._C.libtriton import ir


def test_keeps_a_triton_object_alive_past_teardown():
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(ir.context()))   # nanobind reports it at exit


def test_outcome():
    assert os.environ["OUTCOME"] == "pass"
"""


def _pytest_with_the_conftest(tmp_path, outcome: str, teardown_stderr: str = "0"):
    (tmp_path / "test_leaky.py").write_text("import os\n" + LEAKY_TESTS)
    env = {**os.environ, "OUTCOME": outcome, "HYBRIDKV_TEARDOWN_STDERR": teardown_stderr,
           "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.conftest", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_leaky.py")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def _last_line(proc) -> str:
    return (proc.stdout + proc.stderr).strip().splitlines()[-1]


def test_output_ends_with_the_summary_line_and_keeps_the_exit_status(tmp_path):
    passed = _pytest_with_the_conftest(tmp_path, "pass")
    assert passed.returncode == 0 and re.match(r"2 passed in [\d.]+s", _last_line(passed)), \
        passed.stdout + passed.stderr
    assert "nanobind" not in passed.stdout + passed.stderr
    failed = _pytest_with_the_conftest(tmp_path, "fail")
    assert failed.returncode == 1
    assert re.match(r"1 failed, 1 passed in [\d.]+s", _last_line(failed)), failed.stdout


def test_the_leak_report_is_real_without_the_exit_handler(tmp_path):
    """The reproduction holds: with the handler switched off the run ends in nanobind's report."""
    loud = _pytest_with_the_conftest(tmp_path, "pass", teardown_stderr="1")
    assert loud.returncode == 0 and "nanobind: leaked 1 instances!" in loud.stderr
    assert not re.match(r"2 passed", _last_line(loud))
