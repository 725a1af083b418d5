import pytest

from hybridkv.disk import Choice, CostModel, FlopsModel, measure_read_bandwidth

FM = FlopsModel(n_params=10_000_000, n_layers=8, attn_dim=512)


def test_bandwidth_probe_measures_something(tmp_path):
    bw = measure_read_bandwidth(str(tmp_path), 2 << 20)
    assert bw.nbytes == 2 << 20 and bw.bytes_per_s > 1e6 and list(tmp_path.iterdir()) == []


def test_flops_grow_with_tokens_and_context():
    assert FM.flops(0, 0) == 0
    assert FM.flops(0, 10) < FM.flops(0, 20) < FM.flops(1000, 20)
    swa = FM._replace(window=128)
    assert swa.flops(10_000, 20) < FM.flops(10_000, 20)
    assert swa.flops(10_000, 20) == 2.0 * 1e7 * 20 + 4.0 * 8 * 512 * 20 * 128


def test_decision_follows_the_cheaper_path():
    cm = CostModel(1e9, 1e13, FM)
    d = cm.decide(nbytes=1 << 20, start=0, n_tokens=4096)
    assert d.choice is Choice.LOAD and d.load_s < d.recompute_s
    d = cm.decide(nbytes=1 << 30, start=0, n_tokens=4)
    assert d.choice is Choice.RECOMPUTE and d.load_s > d.recompute_s
    assert cm.decide(1 << 30, 0, 4096, in_flight_left_bytes=1 << 10).choice is Choice.WAIT
    assert cm.decide(1 << 30, 0, 1, in_flight_left_bytes=1 << 30).choice is Choice.RECOMPUTE


@pytest.mark.parametrize("bw,fl", [(0, 1), (1, 0), (-1, 1)])
def test_bad_rates_raise(bw, fl):
    with pytest.raises(ValueError):
        CostModel(bw, fl, FM)
