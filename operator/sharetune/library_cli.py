"""`sharetune library ls | export | import`: a tuning library from the command line. The library
is the tuner's (``sharetune_tuner.store.library``): this command runs the tuner's own CLI,
``sharetune-tuner library`` with the same arguments, in a child process that reads and writes this
one's terminal, and exits with its code (``--help`` is answered there too)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

HELP = "list, export or import the records of a tuning library (a directory or s3://bucket/prefix)"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("library", help=HELP, add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER, help="ls | export | import, and their arguments")
    p.set_defaults(func=run)


def forward(args: list[str]) -> int:
    """Runs ``sharetune-tuner library ARGS``: the arguments go on as typed (options included)."""
    if importlib.util.find_spec("sharetune_tuner") is None:
        print("sharetune library: the tuner is not installed: pip install 'sharetune[tuner]'", file=sys.stderr)
        return 2
    rc = subprocess.call([sys.executable, "-m", "sharetune_tuner.cli", "library", *args])
    return rc if rc >= 0 else 128 - rc  # ended by a signal: reported as a shell does


def run(a: argparse.Namespace) -> int:
    return forward(a.args)
