"""The fault matrix lives in hybridkv.testing.faults: importing the disk tier, the cache manager
and the `hybridkv faults` command loads none of it; the command still runs it (lazily)."""
import pathlib
import pkgutil
import subprocess
import sys

import hybridkv.disk

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_product_modules_do_not_import_the_harness():
    mods = ["hybridkv.cache", "hybridkv.commands.faults"] + [
        f"hybridkv.disk.{m.name}" for m in pkgutil.iter_modules(hybridkv.disk.__path__)]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods) +
            "print(sorted(m for m in sys.modules if m.startswith('hybridkv.testing')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_no_fault_harness_left_in_the_disk_package():
    left = sorted(p.name for p in (ROOT / "hybridkv" / "disk").glob("fault*.py"))
    assert left == [], left


def test_faults_command_finds_its_rows():
    from hybridkv.testing.faults import manager, proc
    assert callable(proc.run_all) and manager.ROWS
