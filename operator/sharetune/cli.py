"""The `sharetune` command: local-mode runs, the operator, and the subcommands other installed
distributions add (the developer tooling's `sharetune cluster`, through the ``sharetune.commands``
entry points: the product never imports them)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from . import library_cli, result_cli, run_cli, smoke

COMMANDS_GROUP = "sharetune.commands"  # each entry point: a callable add_parser(sub)
# The subcommands other distributions of this repository add: command -> (help, distribution, how to
# install it). The quickstart's install (.ci/install-quick) has none of them.
KNOWN_COMMANDS = {
    "cluster": ("a local Kubernetes control plane for development (sharetune-dev)", "the developer tooling "
                "(sharetune-dev)", "pip install -e ./devtools in a sharetune checkout (or: bash .ci/setup.sh)"),
}


def _missing_module(e: ModuleNotFoundError) -> str | None:
    """The third-party module whose absence ``e`` reports, or None when it is one of sharetune's own
    (a bug, raised, never hidden as a missing extra)."""
    if not e.name or e.name.split(".")[0] == "sharetune":
        return None
    return e.name


def _unavailable(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", cmd: str, help: str, why: str,
                 install: str) -> None:
    """``cmd`` without what it needs: still listed, and running it says in one line what is missing
    (``why``) and what to install."""
    def run(_: argparse.Namespace) -> int:
        print(f"sharetune {cmd}: {why}; install it with: {install}", file=sys.stderr)
        return 2
    # Any arguments (the real command's flags included, --help too) reach the message.
    p = sub.add_parser(cmd, help=f"{help} [unavailable: {install}]", add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs="*")
    p.set_defaults(func=run)


def _add(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", commands: dict[str, str], install: str,
         load: Callable[[], Callable[..., None]], needs: tuple[str, ...] = ()) -> None:
    """Adds the commands ``load`` brings (``commands``: name -> help), or, when a module they need is
    missing, lists each of them with what to install. ``needs``: the modules they import only when
    they run (looked up, not imported: `sharetune --help` stays fast)."""
    module = next((m for m in needs if importlib.util.find_spec(m) is None), None)
    if module is None:
        try:
            add_parser = load()
        except ModuleNotFoundError as e:
            module = _missing_module(e)
            if module is None:
                raise
    if module is not None:
        for cmd, help in commands.items():
            _unavailable(sub, cmd, help, f"Python module {module!r} is missing", install)
        return
    add_parser(sub)


def _operator() -> Callable[..., None]:
    from .controller import main as operator_main

    return operator_main.add_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sharetune", description="GPU-shared DNN autotuning on Kubernetes")
    sub = p.add_subparsers(dest="cmd", required=True)
    # The operator needs the `operator` extra (kopf, kubernetes).
    _add(sub, {"operator": "run the TuningJob operator (kopf)"}, "pip install 'sharetune[operator]'", _operator,
         needs=("kopf", "kubernetes"))
    smoke.add_parser(sub)  # imports the kubernetes client (in both extras) only when it runs
    # --local needs the `tuner` extra (TVM); a cluster, the kubernetes client: each says so when run.
    run_cli.add_parser(sub)
    # `result` runs the tuner's CLI in a child process (compiling needs TVM): both must be installed.
    _add(sub, {"result": result_cli.HELP}, "pip install 'sharetune[tuner]'", lambda: result_cli.add_parser,
         needs=("sharetune_tuner", "tvm"))
    _add(sub, {"library": library_cli.HELP}, "pip install 'sharetune[tuner]'", lambda: library_cli.add_parser,
         needs=("sharetune_tuner",))
    # Subcommands of other installed distributions (sharetune-dev: `cluster`).
    found = sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)
    for ep in found:
        dist = ep.dist.name if ep.dist is not None else ep.value.split(".")[0]
        _add(sub, {ep.name: f"from {dist}"}, f"pip install '{dist}'", ep.load)
    # The known ones whose distribution is not installed: listed, and they say what to install.
    for cmd, (help, dist, install) in KNOWN_COMMANDS.items():
        if cmd not in {ep.name for ep in found}:
            _unavailable(sub, cmd, help, f"it comes with {dist}, which is not installed", install)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["library"]:  # its arguments are the tuner's to parse, options and --help included
        return library_cli.forward(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
