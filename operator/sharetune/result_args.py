"""The arguments of `sharetune result fetch|compile` (result_cli.py), which are those of the
tuner's ``result`` too: `sharetune result` checks them, then hands them to the tuner's command
(``sharetune.api.commands.result``)."""

from __future__ import annotations

import argparse
from pathlib import Path

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
