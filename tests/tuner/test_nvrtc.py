"""The NVRTC source rewrite that lets builder workers keep libcu++ precompiled (nvrtc.py).

NVRTC itself needs a CUDA toolkit and runs only on the GPU machine, where bench/h200/build_cost.py
checks the part that matters (every candidate's cubin byte-identical to stock's, CPU-s per build);
here we pin the rewrite and the options on a real TVM-generated CUDA kernel source (TVM's codegen
runs without a GPU)."""

from __future__ import annotations

import os
import shlex

import pytest

from sharetune_tuner.build import nvrtc


def _tvm_cuda_source() -> str:
    """A real kernel source from TVM 0.27's CUDA codegen (it runs without a GPU; without
    cuda-bindings the module keeps its source). TVM's NVRTC path prepends TVM_PREAMBLE to it."""
    import tvm
    from tvm import te

    a = te.placeholder((1024,), name="A")
    b = te.compute((1024,), lambda i: a[i] + 1.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    sch.bind(i, "threadIdx.x")
    lib = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host={"kind": "llvm"}))
    return str(lib.mod.imports[0].inspect_source())


TVM_PREAMBLE = ("#include <cuda/std/cstdint>\nusing cuda::std::uint8_t;\n\n#ifndef __asm__\n#define __asm__ asm\n"
                "#endif\n\n#include <cuda/std/limits>\n#ifndef INFINITY\n"
                "#define INFINITY (::cuda::std::numeric_limits<float>::infinity())\n#endif\n\n")


def test_hoist_puts_every_libcuxx_header_first_and_keeps_the_program() -> None:
    src = TVM_PREAMBLE + _tvm_cuda_source()
    assert "main_kernel" in src
    out = nvrtc.rewrite(src, "hoist-pch")
    head = out.split("\n")[:3]
    # The leading run of includes (what NVRTC's automatic PCH covers) now holds all three headers,
    # type_traits included: it is the one the kernel source includes, and the costly one.
    assert head == ["#include <cuda/std/cstdint>", "#include <cuda/std/limits>", "#include <cuda/std/type_traits>"]
    # The program after them is unchanged, byte for byte: the original includes stay where they
    # were (no-ops by then), so every declaration keeps its meaning.
    assert out.endswith(src)
    assert out.count("\n") == src.count("\n") + 3


def test_other_modes_and_foreign_sources_are_left_alone() -> None:
    src = TVM_PREAMBLE + 'extern "C" __global__ void k() {}\n'
    assert nvrtc.rewrite(src, "stock") == src
    assert nvrtc.rewrite(src, "pch") == src
    plain = 'extern "C" __global__ void k() {}\n'
    assert nvrtc.rewrite(plain, "hoist-pch") == plain


def test_install_sets_the_options_once_and_keeps_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TVM_CUDA_NVRTC_EXTRA_OPTS", "--ftz=false")
    monkeypatch.delenv(nvrtc.MODE_ENV, raising=False)
    assert nvrtc.install() == "hoist-pch"
    assert nvrtc.install("hoist-pch") == "hoist-pch"
    assert shlex.split(os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"]) == ["--ftz=false", "--pch"]
    assert nvrtc.install("stock") == "stock"
    assert shlex.split(os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"]) == ["--ftz=false"]
    with pytest.raises(ValueError, match="SHARETUNE_NVRTC_MODE='fast': expected one of stock, pch, hoist-pch"):
        nvrtc.install("fast")
