"""Where NVRTC's front-end time goes for one real candidate: the candidate's
source as TVM hands it to NVRTC, compiled with NVRTC's ``--time`` report under option/source
variants, several times each in one process (the PCH heap is per process). Prints a table and
writes ``$OUT/nvrtc-probe.json``.

  python bench/h200/nvrtc_probe.py CANDS_JSON [INDEX]
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _capture_source(mod_json: str) -> str:
    import tvm
    import tvm_ffi

    from sharetune_tuner.build.builder import build_without_intrinsics
    from sharetune_tuner.targets import make_target

    got: list[str] = []
    inner = tvm_ffi.get_global_func("tvm_callback_cuda_compile")

    def cap(code: Any) -> Any:
        got.append(str(code))
        return inner(code)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", cap, override=True)
    build_without_intrinsics(tvm.ir.load_json(mod_json), make_target("cuda"), None)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", inner, override=True)
    return got[0]


def _compile(src: str, opts: list[str]) -> dict[str, Any]:
    from cuda.bindings import nvrtc

    tf = tempfile.mktemp(suffix=".csv")
    _, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"tvm_kernels.cu", 0, None, None)
    all_opts = [o.encode() for o in opts + [f"--time={tf}"]]
    t, c = time.perf_counter(), time.process_time()
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(all_opts), all_opts)
    out: dict[str, Any] = {"wall_s": round(time.perf_counter() - t, 3), "cpu_s": round(time.process_time() - c, 3),
                           "ok": res == nvrtc.nvrtcResult.NVRTC_SUCCESS}
    try:
        r = nvrtc.nvrtcGetPCHCreateStatus(prog)
        out["pch_status"] = str(r[0] if isinstance(r, tuple) else r).split(".")[-1]
    except Exception as e:  # older bindings
        out["pch_status"] = f"n/a ({type(e).__name__})"
    if not out["ok"]:
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(n)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        out["log"] = buf.decode(errors="replace")[-400:]
    nvrtc.nvrtcDestroyProgram(prog)
    if os.path.exists(tf):
        with open(tf) as f:
            for row in csv.reader(f):
                if len(row) >= 3 and row[2].strip().isdigit():
                    out[row[1].strip()] = int(row[2])
        os.unlink(tf)
    return out


def _tvm_options() -> list[str]:
    """TVM 0.27's NVRTC options for this machine, as _compile_cuda_nvrtc builds them."""
    from tvm.support import nvcc

    cuda = nvcc.find_cuda_path()
    inc = [os.path.join(cuda, "include")]
    arch_inc = nvcc._find_cuda_target_include(cuda)
    if arch_inc:
        inc += [arch_inc, os.path.join(arch_inc, "cccl")]
    opts = ["--gpu-architecture=sm_90a", "-default-device", "--device-int128"]
    opts += [f"-I{p}" for p in inc if os.path.isdir(p)]
    opts += ["-D__NV_SILENCE_DEPRECATION_BEGIN=", "-D__NV_SILENCE_DEPRECATION_END=",
             "-D__NV_SILENCE_HOST_DEPRECATION_BEGIN=", "-D__NV_SILENCE_HOST_DEPRECATION_END=",
             "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
             "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__",
             "-U__CUDA_NO_BFLOAT162_CONVERSIONS__", "--use_fast_math"]
    opts += [f"--ptxas-options={f}" for f in nvcc._ptxas_option_flags()]
    return opts


def main() -> int:
    cands = json.loads(Path(sys.argv[1]).read_text())
    idx = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    tvm_src = _capture_source(Path(cands[idx]["mod"]).read_text())
    from sharetune_tuner.build import nvrtc as st

    # The program exactly as TVM's NVRTC path sees it after its own preamble.
    pre = ("#include <cuda/std/cstdint>\nusing cuda::std::uint8_t;\nusing cuda::std::uint16_t;\n"
           "using cuda::std::uint32_t;\nusing cuda::std::uint64_t;\nusing cuda::std::int8_t;\n"
           "using cuda::std::int16_t;\nusing cuda::std::int32_t;\nusing cuda::std::int64_t;\n\n"
           "#ifndef __asm__\n#define __asm__ asm\n#endif\n#ifndef __volatile__\n#define __volatile__ volatile\n"
           "#endif\n\n#include <cuda/std/limits>\n#ifndef INFINITY\n"
           "#define INFINITY (::cuda::std::numeric_limits<float>::infinity())\n#endif\n\n")
    body = "\n".join(ln for ln in tvm_src.splitlines() if ln.strip() != "#include <cuda.h>")
    full = pre + body
    empty = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    opts = _tvm_options()
    variants: list[tuple[str, str, list[str]]] = [
        ("stock", full, opts),
        ("stock+pch", full, opts + ["--pch"]),
        ("hoist+pch", st.rewrite(full, "hoist-pch"), opts + ["--pch"]),
        ("hoist+pch+minimal", st.rewrite(full, "hoist-pch"), opts + ["--pch", "--minimal"]),
        ("empty-kernel-tvm-opts", empty, opts),
        ("libcuxx-3-headers", st.rewrite(pre + "#include <cuda/std/type_traits>\n" + empty, "hoist-pch"), opts),
        ("libcuxx-3-headers+pch", st.rewrite(pre + "#include <cuda/std/type_traits>\n" + empty, "hoist-pch"),
         opts + ["--pch"]),
    ]
    res: dict[str, list[dict[str, Any]]] = {}
    for name, src, o in variants:
        res[name] = [_compile(src, o) for _ in range(3)]
        print(name, [{k: v for k, v in r.items() if k != "log"} for r in res[name]], res[name][-1].get("log", ""),
              flush=True)
    try:
        from cuda.bindings import nvrtc

        print("pch heap size", nvrtc.nvrtcGetPCHHeapSize())
    except Exception as e:
        print("pch heap size n/a", e)
    out = os.environ.get("OUT")
    if out:
        Path(out, "nvrtc-probe.json").write_text(json.dumps({"source_head": full[:3000], "results": res}, indent=1))
    print("SOURCE HEAD:\n" + body[:1500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
