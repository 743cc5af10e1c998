"""TVM targets from the job's target kind: ``llvm`` (CPU) or ``cuda`` (arch read from the GPU)."""

from __future__ import annotations

import os
from typing import Any

from .errors import TargetError


def cuda_arch() -> str:
    """``sm_XY`` of GPU 0 via NVML (no CUDA context: RPC servers fork after this)."""
    override = os.environ.get("SHARETUNE_CUDA_ARCH")
    if override:
        return override
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise TargetError(f"target cuda needs an NVIDIA GPU, but NVML found none ({e}); "
                          "set SHARETUNE_CUDA_ARCH=sm_XY to tune for a GPU elsewhere") from None
    # Hopper's tensor-core instructions live in the 'a' variant.
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


def make_target(kind: str, cpu_cores: int | None = None) -> Any:
    import tvm

    if kind == "llvm":
        return tvm.target.Target({"kind": "llvm", "num-cores": int(cpu_cores or os.cpu_count() or 1)})
    if kind == "cuda":
        arch = cuda_arch()
        return tvm.target.Target({"kind": "cuda", "arch": arch, "max_threads_per_block": 1024,
                                  "max_shared_memory_per_block": 49152, "thread_warp_size": 32},
                                 host={"kind": "llvm"})
    raise TargetError(f"unknown target {kind!r}: use llvm or cuda")


def device_for(kind: str, index: int = 0) -> Any:
    import tvm

    return tvm.cpu(index) if kind == "llvm" else tvm.cuda(index)
