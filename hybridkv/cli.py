"""`hybridkv` command line.  Each subcommand is a module in hybridkv/commands/ exposing
NAME, HELP, add_arguments(parser) and run(args) -> exit status."""
import argparse
import importlib
import pkgutil
import sys

import hybridkv.commands as _commands


def _discover():
    mods = {}
    for info in pkgutil.iter_modules(_commands.__path__):
        mod = importlib.import_module(f"hybridkv.commands.{info.name}")
        if hasattr(mod, "NAME"):
            mods[mod.NAME] = mod
    return mods


def build_parser():
    parser = argparse.ArgumentParser(prog="hybridkv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, mod in sorted(_discover().items()):
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
