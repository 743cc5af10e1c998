"""TVM targets from the job's target kind: ``llvm`` (CPU) or ``cuda``.

A cuda target names the GPU's architecture (``sm_XY``). It comes, first found: from
``SHARETUNE_CUDA_ARCH`` (tuning for a GPU elsewhere), from the GPU this process sees (NVML, no CUDA
context), or from the job's own servers. The last is how a cluster's clients learn it: they see no
GPU (``NVIDIA_VISIBLE_DEVICES=void``), and the servers they measure on hold the GPU the job was
given, so the arch is that GPU's by construction, in every sharing mode.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from sharetune import gpus
from sharetune.gpus import ARCH_ENV, arch_of

from .errors import TargetError


def cuda_arch(ask_servers: Callable[[], str] | None = None) -> str:
    """The arch to tune for: ``SHARETUNE_CUDA_ARCH``, else this process's GPU, else (when given)
    what ``ask_servers`` learns from the job's servers."""
    return gpus.cuda_arch(ask_servers)


@functools.cache
def _servers_gpu(host: str, port: int, key: str, timeout_s: float) -> tuple[str, str]:
    """The compute version and name of the GPU behind the job's servers: one short RPC session
    through the tracker (waiting up to ``timeout_s`` for a server to register), asking its device 0.
    Asked once per process: the arch and the tuning library's device name come from one answer."""
    from tvm import rpc

    from .client import wait_for_tracker

    wait_for_tracker(host, port, key, timeout_s)
    try:
        sess = rpc.connect_tracker(host, port).request(key, priority=1, session_timeout=60)
        dev = sess.cuda(0)
        version, name = (str(dev.compute_version), str(dev.device_name)) if dev.exist else (None, None)
    except Exception as e:  # a server built without CUDA, a dropped session, ...
        raise TargetError(f"target cuda: could not ask the job's servers for their GPU ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'no detail'}); set {ARCH_ENV}=sm_XY "
                          "to name the architecture") from None
    if not version or not name:
        raise TargetError(f"target cuda: the job's servers see no GPU; give them one, or set {ARCH_ENV}=sm_XY "
                          "to tune for a GPU elsewhere")
    return version, name


def servers_cuda_arch(host: str, port: int, key: str, timeout_s: float) -> str:
    """The arch of the GPU behind the job's servers (:func:`_servers_gpu`)."""
    major, _, minor = _servers_gpu(host, port, key, timeout_s)[0].partition(".")
    return arch_of(int(major), int(minor or 0))


def servers_gpu_name(host: str, port: int, key: str, timeout_s: float) -> str:
    """The model name of the GPU behind the job's servers (:func:`_servers_gpu`)."""
    return _servers_gpu(host, port, key, timeout_s)[1]


def device_model(kind: str, ask_servers: Callable[[], str] | None = None) -> str:
    """What a job measures on, as the tuning library keys it: the GPU's model name (NVML; a pod's
    client, which sees no GPU, asks the job's servers) or the CPU's."""
    if kind == "cuda":
        try:
            return gpus.nvml_gpu_name()
        except Exception as e:  # no NVIDIA library or GPU here
            if ask_servers is not None:
                return ask_servers()
            raise TargetError(f"target cuda: no GPU here to name the tuning library's device ({e})") from None
    return gpus.cpu_model()


def make_target(kind: str, cpu_cores: int | None = None, ask_servers: Callable[[], str] | None = None) -> Any:
    """The TVM target; ``ask_servers`` (cuda): where the arch comes from when this process sees no GPU."""
    import tvm

    if kind == "llvm":
        return tvm.target.Target({"kind": "llvm", "num-cores": int(cpu_cores or os.cpu_count() or 1)})
    if kind == "cuda":
        arch = cuda_arch(ask_servers)
        return tvm.target.Target({"kind": "cuda", "arch": arch, "max_threads_per_block": 1024,
                                  "max_shared_memory_per_block": 49152, "thread_warp_size": 32},
                                 host={"kind": "llvm"})
    raise TargetError(f"unknown target {kind!r}: use llvm or cuda")


def device_for(kind: str, index: int = 0) -> Any:
    import tvm

    return tvm.cpu(index) if kind == "llvm" else tvm.cuda(index)
