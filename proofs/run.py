"""The whole proof run behind ``hybridkv prove``: BMC, k-induction, vacuity, mutation.

Result per spec invariant (and per auxiliary fact): ``proven`` when the strengthening
S = invariants + aux holds initially and is k-inductive (an unbounded proof) and BMC found
no violation; ``violated`` when BMC found a trace; ``unknown`` otherwise.  ``depth`` is the
depth plain BMC actually reached (every trace of at most that many steps checked).
"""
import multiprocessing
import time
from typing import NamedTuple

from spec.config import SysConfig
from spec.invariants import INVARIANTS

from proofs import search
from proofs.aux import AUX
from proofs.bmc import run_bmc
from proofs.encode import Encoding
from proofs.induction import holds_initially, induction_step
from proofs.mutate import applied, guards_called, mutants
from proofs.satbmc import deep_bmc
from proofs.trace import load as load_trace

FAST = SysConfig(n_obj=1, n_req=2, n_disk=1, n_graph=1, granule=2, max_pos=4, blk_comp=4,
                 blk_tail=2, blk_swa=2, blk_idx=2)   # granule = GCD of the block sizes
DEEP = SysConfig(n_obj=3, n_req=2, n_disk=1, n_graph=1)


class Settings(NamedTuple):
    depth: int = 4             # plain BMC depth (stops early when the budget runs out)
    bmc_budget: float = 60.0   # seconds for plain BMC
    k: int = 2                 # largest k tried for k-induction
    witness_depth: int = 20    # vacuity / kill search depth (stutter steps)
    seed_depth: int = 8        # kill search depth from seed states
    seed_timeout_ms: int = 60_000
    kill_timeout_ms: int = 600_000
    mutation: bool = True
    only: tuple = ()           # restrict mutation to these mutant names
    jobs: int = 1              # worker processes for the mutation run (fork)
    sat: bool = False          # plain BMC on CaDiCaL (proofs.satbmc): the deep tier's engine
    seed_traces: tuple = ()    # trace files whose action lists also seed the kill search


class MutantResult(NamedTuple):
    mutant: object
    killed: bool
    how: str          # seed-replay / seeded-bmc / bmc / inductive / unused / not-killed
    invariant: str    # invariant broken (killed) or ""
    seconds: float
    trace: dict | None


class Report(NamedTuple):
    invariants: list      # dicts: name, method, depth, inductive, result, seconds
    mutations: list       # MutantResult
    unreachable: list
    witnesses: dict
    config: dict
    ctis: list            # BMC counterexamples and CTIs of facts not proven

    def as_json(self):
        survivors = [{"mutant": m.mutant.name, "guard": m.mutant.guard,
                      "conjunct": m.mutant.conjunct, "reason": m.how}
                     for m in self.mutations if not m.killed]
        return {"invariants": self.invariants,
                "mutations": {"killed": sum(m.killed for m in self.mutations),
                              "total": len(self.mutations), "survivors": survivors},
                "unreachable_actions": self.unreachable, "config": self.config}

    @property
    def ok(self):
        return all(r["result"] == "proven" for r in self.invariants) and not self.unreachable


def _props():
    return {**INVARIANTS, **{f"aux:{n}": p for n, p in AUX.items()}}


def prove_invariants(c, st, tick=lambda *_: None):
    """BMC + k-induction of every invariant and auxiliary fact; returns (rows, ctis)."""
    props = _props()
    enc = Encoding(c)
    t0 = time.perf_counter()
    deadline = t0 + st.bmc_budget

    def stop_early(d):
        tick(f"bmc depth {d}")
        return time.perf_counter() > deadline

    if st.sat:
        bmc = deep_bmc(c, depth=st.depth, budget_s=st.bmc_budget, tick=tick)
    else:
        bmc = run_bmc(enc, INVARIANTS, st.depth, aux=AUX, stop_when=stop_early,
                      deadline=deadline)
    bad_init = set(holds_initially(enc, props))
    ind, ctis, k = {}, [], 1
    pending = list(props)
    while pending and k <= st.k:
        res = induction_step(enc, props, k, names=pending, progress=lambda n: tick(f"k={k} {n}"))
        for r in res:
            ind[r.name] = r
        pending = [r.name for r in res if not r.inductive]
        k += 1
    all_inductive = not pending and not bad_init
    ctis = [ind[n].cti for n in pending if ind[n].cti]
    rows = []
    by_name = {r.name: r for r in bmc.invariants}
    for name in props:
        b = by_name.get(name)
        violated = bool(b and b.violated) or name in bad_init
        inductive = all_inductive and bool(ind[name].inductive)
        result = "violated" if violated else ("proven" if inductive else "unknown")
        depth = b.depth if b else (bmc.reached if name[4:] not in bmc.aux_broken else -1)
        secs = (b.seconds if b else 0.0) + ind[name].seconds
        method = f"{'sat-bmc' if st.sat else 'bmc'}+{ind[name].k}-induction"
        rows.append({"name": name, "method": method, "depth": depth,
                     "inductive": inductive, "result": result, "seconds": round(secs, 3)})
        if b and b.trace:
            ctis.append(b.trace)
    return rows, ctis


def vacuity(c, st, tick=lambda *_: None):
    enc = Encoding(c, stutter=True)
    got = search.witnesses(enc, st.witness_depth, st.kill_timeout_ms,
                           progress=lambda new: tick(f"enabled: {', '.join(new)}"))
    names = sorted({ins.name for ins in enc.inst})
    return got, [n for n in names if n not in got]


def mutate_one(c, st, m, prefixes, used):
    t0 = time.perf_counter()

    def done(killed, how, inv="", trace=None):
        return MutantResult(m, killed, how, inv, time.perf_counter() - t0, trace)

    if m.guard not in used:
        return done(False, "unused: the system model never calls this guard")
    with applied(m):
        seeds, acts, inv = search.seeds_under_mutant(c, prefixes)
        if acts is not None:
            t = search.minimize(search.trace_from_actions(c, acts, inv, m.as_json()))
            return done(True, "seed-replay", inv, t)
        enc = Encoding(c, stutter=True)
        res = induction_step(enc, _props(), 1)
        if all(x.inductive for x in res) and not holds_initially(enc, _props()):
            return done(False, "redundant: every invariant stays inductive without it")
        t, r, _ = search.kill(enc, st.seed_depth, seeds, timeout_ms=st.seed_timeout_ms,
                              mutant=m.as_json())
        if t:
            return done(True, "seeded-bmc", t["invariant"], t)
        t, r, _ = search.kill(enc, st.witness_depth, None, timeout_ms=st.kill_timeout_ms,
                              mutant=m.as_json())
        if t:
            return done(True, "bmc", t["invariant"], t)
        return done(False, f"not killed: no violation within {st.witness_depth} steps ({r})")


def _mutate_star(w):
    return mutate_one(*w)


def prove(c, st=Settings(), tick=lambda *_: None, mutation_config=None):
    """Everything; ``tick(msg)`` is called as work advances (progress bar).  The mutation
    run uses ``mutation_config`` (default: ``c``), with its own vacuity witnesses as seeds."""
    rows, ctis = prove_invariants(c, st, tick)
    wit, unreachable = vacuity(c, st, tick)
    results = []
    mc = mutation_config or c
    if st.mutation:
        seeds = wit if mc == c else vacuity(mc, st, tick)[0]
        used = guards_called(lambda: Encoding(mc))
        known = [search.actions_of(load_trace(p)) for p in st.seed_traces]
        prefixes = [list(p) for p in sorted({tuple(a) for a in list(seeds.values()) + known},
                                            key=len)]
        todo = [m for m in mutants() if not st.only or m.name in st.only]
        work = [(mc, st, m, prefixes, used) for m in todo]
        if st.jobs > 1:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(st.jobs) as pool:
                for r in pool.imap_unordered(_mutate_star, work):
                    results.append(r)
                    tick(f"mutant {r.mutant.name}: {'killed' if r.killed else 'survived'}")
        else:
            for w in work:
                results.append(_mutate_star(w))
                tick(f"mutant {w[2].name}: {'killed' if results[-1].killed else 'survived'}")
        order = {m.name: j for j, m in enumerate(todo)}
        results.sort(key=lambda r: order[r.mutant.name])
    cfg = dict(c._asdict(), depth=st.depth, witness_depth=st.witness_depth,
               seed_depth=st.seed_depth, k=st.k,
               mutation_config=mc._asdict() if st.mutation else None)
    return Report(rows, results, unreachable, wit, cfg, ctis)

