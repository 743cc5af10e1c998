"""TVM's tensor intrinsics from a serialised cache instead of from TVMScript.

MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which parses every tensor
intrinsic of every target (CUDA mma/wmma/ldmatrix, x86, ARM, ROCm, Hexagon, ...) from TVMScript:
13-15 s of one core on our CPU machines, about 20 s per client on the H200 machine while the
other clients do the same (bench/results/h200-cells.jsonl: six clients sat at one core each for
~21 s before their first search round). The registered PrimFuncs are plain IR, so we serialise
them once (``tvm.ir.save_json``) and later processes register them from the file in well under a
second. The tuner image builds the cache at image build time; elsewhere the first client that
finds none writes it.

The cache is keyed by the TVM and tvm-ffi versions and the intrinsic sources themselves, so an
upgraded TVM never registers stale definitions. After loading, the package module is present
but not executed; a later explicit import of one of its submodules (e.g. dlight's
``from tvm.s_tir.tensor_intrin.cuda import ...``) still works: it runs the real file, whose
registrations then replace the cached ones with equal definitions.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("sharetune.intrinsics")
PACKAGE = "tvm.s_tir.tensor_intrin"
ENV_DIR = "SHARETUNE_INTRINSICS_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "sharetune")


def _package_dir() -> Path:
    import tvm.s_tir

    return Path(tvm.s_tir.__file__).parent / "tensor_intrin"


def cache_key() -> str:
    """Versions + the intrinsic sources + whether LLVM is on (it decides which targets register)."""
    import tvm
    import tvm_ffi
    from tvm.runtime import enabled

    h = hashlib.sha256(f"{tvm.__version__}|{tvm_ffi.__version__}|llvm={enabled('llvm')}".encode())
    for f in sorted(_package_dir().glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_path(directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / f"tensor-intrinsics-{cache_key()}.json"


@contextlib.contextmanager
def _patched_register(on_register: Any) -> Iterator[None]:
    """Routes ``TensorIntrin.register`` through ``on_register(name, desc, impl, override)``."""
    from tvm.s_tir import TensorIntrin

    original = TensorIntrin.__dict__["register"]
    TensorIntrin.register = staticmethod(on_register)  # type: ignore[method-assign]  # swapped for the parse only
    try:
        yield
    finally:
        TensorIntrin.register = original  # type: ignore[method-assign]  # and put back


def capture() -> list[tuple[str, Any, Any]]:
    """Imports the real package, recording every registration it makes (and making it)."""
    from tvm.s_tir import TensorIntrin

    if PACKAGE in sys.modules:
        raise RuntimeError(f"{PACKAGE} is already imported: its registrations cannot be captured")
    register = TensorIntrin.__dict__["register"].__func__
    seen: list[tuple[str, Any, Any]] = []

    def recording(name: str, desc: Any, impl: Any, override: bool = False) -> Any:
        seen.append((str(name), desc, impl))
        return register(name, desc, impl, override)

    with _patched_register(recording):
        importlib.import_module(PACKAGE)
    return seen


def write_cache(intrinsics: list[tuple[str, Any, Any]], path: Path) -> None:
    import tvm

    body = {"key": path.stem.rsplit("-", 1)[-1], "names": [n for n, _, _ in intrinsics],
            "ir": tvm.ir.save_json([f for _, d, i in intrinsics for f in (d, i)])}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
    os.chmod(tmp, 0o644)  # built as root in the image, read by the tuner's own UID
    os.replace(tmp, path)  # concurrent clients: readers see a whole file or none


def read_cache(path: Path) -> list[tuple[str, Any, Any]] | None:
    """The cached intrinsics, or None when the file is missing, stale or unreadable."""
    import tvm

    try:
        body = json.loads(path.read_text())
        if body.get("key") != path.stem.rsplit("-", 1)[-1]:
            return None
        funcs = list(tvm.ir.load_json(body["ir"]))
        names = list(body["names"])
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        log.warning("ignoring unreadable intrinsics cache %s: %s", path, e)
        return None
    if len(funcs) != 2 * len(names):
        return None
    return [(n, funcs[2 * k], funcs[2 * k + 1]) for k, n in enumerate(names)]


class _ReRegisteringFinder(importlib.abc.MetaPathFinder):
    """Lets a submodule of the not-executed package be imported for real: its registrations
    override the cached ones (same definitions) instead of failing as duplicates."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            from tvm.s_tir import TensorIntrin

            register = TensorIntrin.__dict__["register"].__func__
            with _patched_register(lambda n, d, i, override=False: register(n, d, i, True)):
                real_exec(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's loading re-registers
        return spec


def _install_package_stub() -> None:
    import tvm.s_tir

    pkg_dir = _package_dir()
    spec = importlib.util.spec_from_file_location(PACKAGE, pkg_dir / "__init__.py",
                                                  submodule_search_locations=[str(pkg_dir)])
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    tvm.s_tir.tensor_intrin = module  # type: ignore[attr-defined]  # TVM's lazy submodule, set before its import
    if not any(isinstance(f, _ReRegisteringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ReRegisteringFinder())


def register_from(intrinsics: list[tuple[str, Any, Any]]) -> None:
    from tvm.s_tir import TensorIntrin

    for name, desc, impl in intrinsics:
        TensorIntrin.register(name, desc, impl, override=True)
    _install_package_stub()


@contextlib.contextmanager
def _building(path: Path) -> Iterator[None]:
    """An exclusive lock beside the cache file while it is read or built: the quickstart's
    clients start together on the same machine, and each parsed the whole package at once
    (36 s and 43 s on 2 cores) where one parse and one read will do. No lock where none can be
    taken (a read-only directory): then each process parses, as before."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def ensure_registered(directory: Path | None = None) -> str:
    """Registers TVM's tensor intrinsics the fastest way available; returns how: ``imported``
    (already done), ``cache`` (from the file) or ``built`` (parsed, then written to the cache).
    A cache that cannot be written (read-only home) only costs the speed-up."""
    if PACKAGE in sys.modules:
        return "imported"
    t0 = time.monotonic()
    path = cache_path(directory)
    with _building(path):  # one parse per machine: clients started together wait for the first
        cached = read_cache(path) if path.exists() else None
        if cached is not None:
            register_from(cached)
            log.info("registered %d tensor intrinsics from %s in %.2f s", len(cached), path, time.monotonic() - t0)
            return "cache"
        seen = capture()
        try:
            write_cache(seen, path)
        except OSError as e:
            log.warning("cannot write the intrinsics cache %s: %s", path, e)
    log.info("parsed %d tensor intrinsics in %.1f s (cached at %s)", len(seen), time.monotonic() - t0, path)
    return "built"


def main(argv: list[str] | None = None) -> int:
    """``python -m sharetune_tuner.model.intrinsics [DIR]``: builds the cache (image build, bench setup)."""
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    how = ensure_registered(directory)
    print(f"{how}: {cache_path(directory)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
