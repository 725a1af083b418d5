"""Z3 proofs over the spec: BMC, induction, mutation, counterexample traces."""
