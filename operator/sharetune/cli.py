"""The `sharetune` command: local-mode runs, the operator, and the subcommands other installed
distributions add (the developer tooling's `sharetune cluster`, through the ``sharetune.commands``
entry points: the product never imports them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

COMMANDS_GROUP = "sharetune.commands"  # each entry point: a callable add_parser(sub)


def _missing_module(e: ModuleNotFoundError) -> str | None:
    """The third-party module whose absence ``e`` reports, or None when it is one of sharetune's own
    (a bug, raised, never hidden as a missing extra)."""
    if not e.name or e.name.split(".")[0] == "sharetune":
        return None
    return e.name


def _unavailable(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", cmd: str, help: str, module: str,
                 install: str) -> None:
    """``cmd`` without what it needs: still listed, and running it says what to install."""
    def run(_: argparse.Namespace) -> int:
        print(f"sharetune {cmd}: Python module {module!r} is missing; install it with: {install}", file=sys.stderr)
        return 2
    # Any arguments (the real command's flags included, --help too) reach the message.
    p = sub.add_parser(cmd, help=f"{help} [unavailable: {install}]", add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs="*")
    p.set_defaults(func=run)


def _add(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", cmd: str, help: str, install: str,
         load: Callable[[], Callable[..., None]]) -> None:
    try:
        add_parser = load()
    except ModuleNotFoundError as e:
        module = _missing_module(e)
        if module is None:
            raise
        _unavailable(sub, cmd, help, module, install)
        return
    add_parser(sub)


def _operator() -> Callable[..., None]:
    from .controller import main as operator_main
    from . import smoke

    def add(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
        operator_main.add_parser(sub)
        smoke.add_parser(sub)
    return add


def _run() -> Callable[..., None]:
    from sharetune_tuner import local_cli  # local mode lives with the tuner runtime

    return local_cli.add_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sharetune", description="GPU-shared DNN autotuning on Kubernetes")
    sub = p.add_subparsers(dest="cmd", required=True)
    # The operator needs the `operator` extra (kopf, kubernetes).
    _add(sub, "operator", "run the TuningJob operator (kopf)", "pip install 'sharetune[operator]'", _operator)
    # Local mode needs the `tuner` extra (TVM, rich ...).
    _add(sub, "run", "run a TuningJob (local mode: as processes on this machine)",
         "pip install 'sharetune[tuner]'", _run)
    # Subcommands of other installed distributions (sharetune-dev: `cluster`).
    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else ep.value.split(".")[0]
        _add(sub, ep.name, f"from {dist}", f"pip install '{dist}'", ep.load)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
