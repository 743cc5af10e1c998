"""`sharetune result fetch|compile WHERE -o DIR`: a job's result as users deploy it. Fetching and
compiling are the tuner's work (compiling needs TVM): the command parses its arguments
(result_args.py), then runs the tuner's own CLI, ``sharetune-tuner result`` with the same
arguments, in a child process that reads and writes this one's terminal, and exits with its code."""

from __future__ import annotations

import argparse
import subprocess
import sys

from .api import commands
from .result_args import HELP, add_arguments


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("result", help=HELP)
    add_arguments(p)
    p.set_defaults(func=run)


def tuner_args(a: argparse.Namespace) -> list[str]:
    """The tuner's command line for the parsed `sharetune result` arguments ``a``."""
    model = getattr(a, "model", None)  # compile only
    return commands.result(a.result_cmd, a.where, str(a.out), namespace=a.namespace,
                           model=None if model is None else str(model))


def run(a: argparse.Namespace) -> int:
    rc = subprocess.call([sys.executable, "-m", "sharetune_tuner.cli", *tuner_args(a)])
    return rc if rc >= 0 else 128 - rc  # ended by a signal: reported as a shell does
