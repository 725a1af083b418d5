"""Z3 proofs over the spec: BMC, induction, mutation, counterexample traces.

Modules: ``encode`` (spec.step on bit-vector states -> transition relation), ``bmc`` (plain
bounded model checking with per-depth lemmas), ``induction`` (k-induction, Houdini), ``aux``
(auxiliary invariants that make the spec's invariants inductive), ``mutate`` (guard-conjunct
mutants swapped in via ``__code__``), ``search`` (vacuity witnesses, seeded kill searches,
trace minimisation), ``trace`` (JSON traces, printing, replay), ``run`` (everything), ``bfs``.

Tiers:
  fast  ``pytest tests/test_proofs.py tests/test_proofs_golden.py`` (default test run)
  CLI   ``hybridkv prove [--json] [--jobs 2]``           fast configuration, with mutation
  deep  ``hybridkv prove --deep --jobs 2``  and  ``pytest -m slow tests/test_proofs_deep.py``
  parametric  ``hybridkv prove --parametric [--mutate] [--json]`` (``pstate``, ``parametric``;
        ``finite`` and ``cti``: finite CTIs of steps not proven and a concrete trace at their
        sizes; ``pmutate``: guard mutation on this tier): every size at once;
        ``tests/proofs/test_proofs_parametric*.py``
  replay ``hybridkv replay-trace tests/golden/*.json``
"""
