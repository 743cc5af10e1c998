"""`sharetune result fetch|compile WHERE -o DIR`: a job's result as users deploy it. Fetching and
compiling are the tuner's work (compiling needs TVM): the command runs the tuner's own CLI,
``sharetune-tuner result`` with the same arguments, in a child process that reads and writes this
one's terminal, and exits with its code."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .api import commands

HELP = "fetch a job's best records, or compile the model with them"
WHERE_HELP = ("a local-mode work dir (runs/NAME), tj/NAME (with -n), configmap://NAMESPACE/NAME or "
              "s3://BUCKET/PREFIX/result (the job's status.resultLocation)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fetch`` and ``compile`` with their arguments: the same for `sharetune result` and the
    tuner's ``result``."""
    acts = p.add_subparsers(dest="result_cmd", required=True)
    fetch = acts.add_parser("fetch", help="the best records as a MetaSchedule JSONDatabase (DIR/database), "
                                          "every trial (DIR/records) and the summary")
    build = acts.add_parser("compile", help="fetch, then build the model with the best records for the job's "
                                            "target: DIR/model.so, DIR/params.npz, DIR/model.json")
    for a in (fetch, build):
        a.add_argument("where", help=WHERE_HELP)
        a.add_argument("-o", "--out", type=Path, required=True, help="output directory")
        a.add_argument("-n", "--namespace", default=None, help="the TuningJob's namespace (tj/NAME); "
                                                              "default: the kubeconfig context's")
    build.add_argument("--model", type=Path, default=None,
                       help="the ONNX file the job tuned (needed when the result does not carry it: "
                            "a local path, PVC or another machine's file)")


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
