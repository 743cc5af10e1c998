"""This machine's NVIDIA GPUs as NVML sees them, without a CUDA context (processes that fork
later, such as RPC servers, must not hold one): how many there are, and the architecture a cuda
job tunes for. ``pynvml`` is imported only when asked: a machine without the NVIDIA library has
no GPU."""

from __future__ import annotations

import os
from collections.abc import Callable

from .api.errors import TargetError

ARCH_ENV = "SHARETUNE_CUDA_ARCH"


def arch_of(major: int, minor: int) -> str:
    """``sm_XY`` of a compute capability; Hopper's tensor-core instructions live in the 'a' variant."""
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


def nvml_cuda_arch() -> str:
    """GPU 0's arch via NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    return arch_of(int(major), int(minor))


def nvml_gpu_name() -> str:
    """GPU 0's model name via NVML, e.g. "NVIDIA H100 80GB HBM3"."""
    import pynvml

    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    return name.decode() if isinstance(name, bytes) else str(name)


def cpu_model() -> str:
    """This machine's CPU model name (/proc/cpuinfo; the platform's processor elsewhere)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def cuda_arch(otherwise: Callable[[], str] | None = None) -> str:
    """The arch to tune for: ``SHARETUNE_CUDA_ARCH``, else GPU 0's, else (when given) what
    ``otherwise`` finds; else a TargetError that says how to name one."""
    override = os.environ.get(ARCH_ENV)
    if override:
        return override
    try:
        return nvml_cuda_arch()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, no device, ...
        if otherwise is not None:
            return otherwise()
        raise TargetError(f"target cuda needs an NVIDIA GPU, but NVML found none ({e}); "
                          f"set {ARCH_ENV}=sm_XY to tune for a GPU elsewhere") from None


def gpu_count() -> int:
    """GPUs NVML sees here (0 without a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver / library: no GPU
        return 0
