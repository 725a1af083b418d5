"""Trace replay benchmarks: readers and generators (traces), vLLM-style LRU and Belady baselines
(baselines), per-layout byte/FLOP costs (layouts), block-level managers (managers) and the replay
loop (sim). Entry point: `hybridkv replay`."""
