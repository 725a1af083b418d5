"""Subcommands of the `hybridkv` CLI, one module each (discovered at start-up)."""
