"""`python -m hybridkv.bench.breakeven`: both paths it times take a block through its whole
life (the pool ends as it began), and it prints one row of seven ratios per run length."""
from hybridkv.bench import breakeven


def test_life_returns_every_block_either_path():
    pool = breakeven.bench_pool("comp", 64)
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
