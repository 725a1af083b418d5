"""The tree passes the ruff configuration in pyproject.toml (E, F, W; line length 100)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff():
    exe = pathlib.Path(sys.executable).with_name("ruff")
    if exe.exists():
        return str(exe)
    return shutil.which("ruff")


def test_ruff_clean():
    ruff = _ruff()
    if ruff is None:
        pytest.fail("ruff is not installed: it is in the dev extra (pip install -e '.[dev]')")
    out = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
