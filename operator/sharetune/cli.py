"""The `sharetune` command: local control plane, local-mode runs, the operator."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sharetune", description="GPU-shared DNN autotuning on Kubernetes")
    sub = p.add_subparsers(dest="cmd", required=True)
    from .cluster import cli as cluster_cli
    cluster_cli.add_parser(sub)
    try:  # the operator needs the `operator` extra (kopf, kubernetes)
        from .controller import main as operator_main
    except ImportError:
        operator_main = None  # type: ignore[assignment]
    if operator_main is not None:
        operator_main.add_parser(sub)
        from . import smoke

        smoke.add_parser(sub)
    try:  # local mode lives with the tuner runtime; absent when only the operator extra is installed
        from sharetune_tuner import local_cli
    except ImportError:
        local_cli = None  # type: ignore[assignment]
    if local_cli is not None:
        local_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
