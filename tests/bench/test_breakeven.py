"""`python -m hybridkv.bench.breakeven`: both paths it times take a block through its whole
life (the pool ends as it began), and it prints one row of seven ratios per run length."""
from hybridkv.bench import breakeven
from hybridkv.cache.pool import Pool
from hybridkv.cache.tables import GroupCtx
from hybridkv.layout import ModelLayout


def _pool():
    layout = ModelLayout.v4_mini()
    g = next(g for g in layout.groups if "comp" in g.kinds)
    return Pool("comp", g, 64, layout.pool_tensors("comp", g), layout.abi("comp", g),
                GroupCtx(g, breakeven.NO_LIMIT, breakeven.NO_LIMIT), "meta")


def test_life_returns_every_block_either_path():
    pool = _pool()
    for run_min in (1, 1 << 30):
        pool.run_min = run_min
        times = breakeven.life_times(pool, 12, reps=3)
        assert set(times) == set(breakeven.EVENTS) and min(times.values()) > 0
        assert pool.n_free == pool.n and pool.n_writing == 0


def test_main_prints_a_row_per_length(capsys):
    breakeven.main(["--reps", "2"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [int(r.split()[0]) for r in rows] == list(breakeven.LENGTHS)
    assert all(r.count("(") == len(breakeven.EVENTS) for r in rows)
