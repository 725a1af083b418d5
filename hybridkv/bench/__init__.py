"""Trace replay benchmarks: readers and generators (traces), the traces shipped as package data
and their names (shipped, data/), the real CacheManager driven like an
engine (runtime; each request's output-length class as the lookup hint), vLLM-style LRU and
Belady baselines (baselines, managers.LRUManager), per-layout byte/FLOP costs (layouts), the
replay loop and the three-way comparison (replay); the issue-8 simulator (managers.PolicyManager,
oracle) stays as a reference. Entry point: `hybridkv replay`."""
