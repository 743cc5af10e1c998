"""`sharetune run`: one command for both shells. ``--local`` runs the job's topology as processes on
this machine (local/cli.py: its processes need TVM); without it the job is submitted to the
current cluster and followed there (submit.py: needs the kubernetes client only)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from .api.exitcodes import ExitCode


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("run", help="run a TuningJob: on the current cluster, or with --local as processes here")
    p.add_argument("job", type=Path, nargs="+",
                   help="TuningJob YAML; several run at once (locally the cuda ones share each GPU through one MPS "
                        "daemon, admitted by their gpuSharing.share, first come first served)")
    p.add_argument("--local", action="store_true",
                   help="run the topology as local processes on this machine (default: submit to the cluster "
                        "of the current kubeconfig context and follow it)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="--local: default ./runs/<job name> (several jobs: ./runs, one folder per job)")
    p.add_argument("--json", type=Path, default=None, help="--local: also write the summary here")
    p.add_argument("-n", "--namespace", default=None,
                   help="cluster: the namespace (default: the manifest's, else the kubeconfig context's)")
    p.add_argument("--detach", action="store_true", help="cluster: return once the job is created")
    p.set_defaults(func=run)


def _missing(module: str, install: str, what: str) -> int:
    print(f"sharetune run: {what} needs Python module {module!r}, which is missing; install it with: {install}",
          file=sys.stderr)
    return int(ExitCode.USAGE)


def run(a: argparse.Namespace) -> int:
    if a.local:
        if a.detach or a.namespace:
            print("sharetune run: --detach and --namespace are for a cluster; --local runs here", file=sys.stderr)
            return int(ExitCode.USAGE)
        if importlib.util.find_spec("tvm") is None:
            return _missing("tvm", "pip install 'sharetune[tuner]'", "--local")
        from .local import cli as local_cli  # imported to run only: other commands need neither it nor rich

        return local_cli.run(a)
    if a.workdir or a.json:
        print("sharetune run: --workdir and --json are for --local; a cluster job's result is fetched with "
              "sharetune result fetch", file=sys.stderr)
        return int(ExitCode.USAGE)
    if importlib.util.find_spec("kubernetes") is None:
        return _missing("kubernetes", "pip install 'sharetune[operator]'", "submitting to a cluster")
    from . import submit

    return submit.run(a)
