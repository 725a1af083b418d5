"""The disk tier's fault matrix (``hybridkv faults``): each row injects one fault through a
FileOps subclass or a HookedBackend hook, never by patching globals, and counts from the
caller's side what ``kit`` lists; every count must end at 0.

  kit       the columns (FaultRow), the Counter that runs calls against a deadline
  hooks     HookedBackend hooks: fail_on, gate, slow
  files     file faults: EIO, ENOSPC, bit flips, truncation, a recycled destination
  tier      the tier as a whole: transient reads, special files, a hung backend, a full Redis
  proc      other processes and Redis: crash before rename, racing writers, lost Redis,
            format-version skew; ``run_all`` runs the whole matrix
  manager   the cache manager on top of the tier: version bump with loads in flight, forged
            plans, a hung Redis

The product never imports this package; ``hybridkv faults`` imports it when it runs."""
