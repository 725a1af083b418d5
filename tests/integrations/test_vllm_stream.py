"""The stream tier and vLLM's block ids over hybridkv's pools: the id split (always, no vLLM),
and the stream / DeepSeek-V4 checks on vLLM's real Scheduler under the vLLM venv
(tests/integrations/stream_checks.py; skipped, with the reason, when the venv from
scripts/vllm_venv is absent: set HYBRIDKV_VLLM_PYTHON or create ../vllm-venv)."""
import os
import subprocess

import pytest

from hybridkv.bench.vllm_streams import find_vllm_python
from hybridkv.errors import BadArgument
from hybridkv.integrations.vllm.id_space import PagedIds, PoolIds, id_space, pool_split
from hybridkv.layout import LayerGroup, ModelLayout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(REPO, "tests", "integrations", "stream_checks.py")


def group(name, kind, block, window=0):
    return LayerGroup(name, kind, (int(name[1:]),), block, window, head_dim=1)


V4 = ModelLayout([group("g0", "swa", 64, 128), group("g1", "swa", 64, 128),
                  group("g2", "full", 256), group("g3", "swa", 4, 8), group("g4", "swa", 8, 128)])
FULL_SWA = ModelLayout([group("g0", "full", 16), group("g1", "swa", 16, 128)])


@pytest.mark.parametrize("num_blocks", [64, 129, 3000, 8000, 20000])
@pytest.mark.parametrize("layout", [V4, FULL_SWA], ids=["v4", "full+swa"])
def test_pool_ids_partition_vllms_ids(layout, num_blocks):
    ids = PoolIds(layout, num_blocks, 8192, 32)
    every = [ids.vllm_id(pk, slot, sub) for pk, n in ids.slots.items()
             for slot in range(n) for sub in range(ids.span[pk])]
    assert len(every) == len(set(every))                    # no id twice
    assert min(every) == 1 and max(every) <= num_blocks - 1  # 0 is vLLM's null block
    assert len(every) > 0.97 * (num_blocks - 1)             # (almost) none left unused
    with pytest.raises(BadArgument):
        ids.vllm_id(("comp", "g2" if layout is V4 else "g0"), ids.slots[
            ("comp", "g2" if layout is V4 else "g0")], 0)


def test_a_window_pool_holds_one_step_when_there_is_room():
    slots = pool_split(V4, 7999, 8192, 32)
    assert slots[("swa", "g3")] >= 8192 // 8 + 2          # 4-token blocks, window 8
    assert slots[("swa", "g4")] >= 8192 // 128 + 2
    slots = pool_split(V4, 19999, 8192, 32)                 # room for 4 pages a request too
    checkpoints = slots[("swa", "g0")] - (8192 // 128 + 2) - 4 * 32
    # a checkpoint (22 ids of window pages) per 16384 chain tokens (64 ids of 256-token blocks)
    assert checkpoints > 100 and 64 * checkpoints <= slots[("comp", "g2")] < 64 * checkpoints + 86


def test_whole_prompt_fits_counts_a_window_once():
    ids = PoolIds(FULL_SWA, 20000, 8192, 32)
    need = {("comp", "g0"): 5000, ("swa", "g1"): 5000 * 16 // 128}
    held = ids.at_once(need)
    assert held == {("comp", "g0"): 5000, ("swa", "g1"): 8192 // 128 + 2}
    assert ids.fits(held, {("comp", "g0"): 5000, ("swa", "g1"): 66})
    assert not ids.fits(held, {("comp", "g0"): 4999, ("swa", "g1"): 10 ** 6})


def test_the_arena_serves_layouts_without_a_wide_window():
    assert isinstance(id_space(ModelLayout([group("g0", "full", 16)]), 64), PagedIds)
    assert isinstance(id_space(FULL_SWA, 64), PoolIds)
    with pytest.raises(BadArgument, match="too small"):
        PoolIds(FULL_SWA, 5)                      # a window page alone is 8 of the 4 ids
    tiny = id_space(FULL_SWA, 17)                 # one arena page of 8 ids still serves
    assert isinstance(tiny, PagedIds) and tiny.num_pages == 2


@pytest.mark.slow     # ~30 s in the vLLM venv (vLLM's Scheduler, both managers, 3 shapes)
def test_stream_and_v4_on_vllms_scheduler():
    py = find_vllm_python()
    if py is None:
        pytest.skip("no vLLM venv (scripts/vllm_venv ../vllm-venv, or HYBRIDKV_VLLM_PYTHON)")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1",
               VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH=REPO)
    out = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                          "--rootdir", os.path.dirname(CHECKS), CHECKS], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
