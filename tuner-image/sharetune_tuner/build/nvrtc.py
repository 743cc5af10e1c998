"""Cheaper NVRTC compiles of CUDA candidates, with the same generated code.

Measured on the H200 (bench/h200/build_cost.py, bench/h200/nvrtc_probe.py): of a candidate's
build (~0.9 CPU-s median for first-round candidates of ResNet-18/50 convs and dense layers, more
for the heavily unrolled ones the search favours later), NVRTC's C++ front end is ~0.65-0.88 s,
nearly all of it parsing libcu++ headers: ``<cuda/std/type_traits>``, which the kernel source TVM
generates includes (inside ``#ifdef __CUDACC_RTC__``), and ``<cuda/std/cstdint>`` /
``<cuda/std/limits>`` from the preamble TVM's NVRTC path puts before it. The same headers with an
empty kernel take 0.09 s without ``type_traits``. NVRTC (CUDA 12.8+) keeps headers precompiled in a
per-process heap (``--pch``), but its automatic PCH only covers the leading run of ``#include``
lines of the program, and TVM's preamble has code between its includes and the kernel's. So we
put every libcu++ include the program has at its very top (each original line then finds the
header already included: its include guard makes it a no-op, the code is unchanged: the cubins
are byte-identical, checked per candidate by the bench) and pass ``--pch``. A builder worker builds
many candidates (``builder.PooledBuilder`` keeps its workers), so the PCH made by its first build
serves all later ones.

Modes (``SHARETUNE_NVRTC_MODE``, default ``hoist-pch``): ``stock`` (TVM as shipped), ``pch``
(``--pch`` alone: measured to gain nothing), ``hoist-pch``. The source is rewritten where NVRTC
receives it (``nvrtcCreateProgram``): TVM adds its preamble inside its own compile function,
after every hook it offers.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

MODE_ENV = "SHARETUNE_NVRTC_MODE"
MODES = ("stock", "pch", "hoist-pch")
DEFAULT_MODE = "hoist-pch"
_OPTS_ENV = "TVM_CUDA_NVRTC_EXTRA_OPTS"  # read by TVM on every NVRTC compile
_LIBCUXX = re.compile(r"^\s*#\s*include\s*<(cuda/std/[A-Za-z_/]+)>\s*$", re.M)


def options(mode: str) -> list[str]:
    """The NVRTC options a mode adds to TVM's."""
    return [] if mode == "stock" else ["--pch"]


def rewrite(src: str, mode: str) -> str:
    """The program NVRTC compiles under ``mode``, from the one TVM hands it: under ``hoist-pch``
    the libcu++ headers it includes anywhere, included once more at the top, in order of first
    appearance."""
    if mode != "hoist-pch":
        return src
    headers = list(dict.fromkeys(_LIBCUXX.findall(src)))
    if not headers:
        return src
    return "".join(f"#include <{h}>\n" for h in headers) + src


def install(mode: str | None = None) -> str:
    """Makes this process's NVRTC compiles use ``mode`` (default: ``$SHARETUNE_NVRTC_MODE`` or
    ``hoist-pch``); idempotent. Returns the mode. Without cuda-bindings (a CPU-only install) only
    the environment is set: there is nothing to compile."""
    mode = mode or os.environ.get(MODE_ENV) or DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    os.environ[MODE_ENV] = mode
    base = [t for t in shlex.split(os.environ.get(_OPTS_ENV, "")) if t not in _all_options()]
    os.environ[_OPTS_ENV] = shlex.join(base + options(mode))
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return mode
    if hasattr(nvrtc.nvrtcCreateProgram, "_sharetune_inner"):
        return mode  # already wrapped; the wrapper reads the mode per call
    create = nvrtc.nvrtcCreateProgram

    def create_program(src: bytes, name: bytes, *args: Any) -> Any:
        # The mode is read per call: a test or bench may switch it in a live process.
        m = os.environ.get(MODE_ENV, DEFAULT_MODE)
        return create(rewrite(src.decode(), m).encode(), name, *args)

    create_program._sharetune_inner = create  # type: ignore[attr-defined]  # marks the wrapper: installed once
    nvrtc.nvrtcCreateProgram = create_program
    return mode


def _all_options() -> set[str]:
    return {o for m in MODES for o in options(m)}
