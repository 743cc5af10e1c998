"""A MetaSchedule builder that keeps its worker processes between build batches.

Stock ``LocalBuilder`` starts a fresh process pool for every batch (to dodge a slow memory leak
in long-lived workers), so every batch pays ``import tvm`` once per worker: 2.4 s on our CPU
machines, ~7 s on the GPU machine. With small batches that import dominated the whole trial
(measured: SendToBuilder was 46% of a tiny shard's time). We keep the pool and recycle each
worker after ``max_uses`` builds instead, which bounds the leak the same way.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from ..tvm_private import build_candidate, serialize_params
from . import nvrtc
from .protocol import ARTIFACT_DIR_ENV


def build_without_intrinsics(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's ``default_build`` minus its ``import tvm.s_tir.tensor_intrin``: that import
    parses every tensor intrinsic of every target from TVMScript (~10 s of CPU for the CUDA ones
    alone) in each fresh builder worker, which made the first batch of every pool take ~30 s on the
    H200 machine (bench/results/h200-tuning.json, profile). A candidate arrives already scheduled
    (tensorize applied in the client, which does register the intrinsics), so building it does
    not need the registry."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    if target.kind.name == "cuda":
        nvrtc.install()  # once per worker: its PCH then serves every later build (nvrtc.py)
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    # Inside the target's scope: TVM's NVRTC callback reads the arch from Target.current() and,
    # without one, asks GPU 0 (tvm.cuda(0).exist), which makes every builder worker a CUDA
    # client: under a GPU pool, three jobs' workers took all 48 MPS client slots on the H200.
    with target:
        return tvm_build(mod, target=target)


def export_shared(mod: Any) -> str:
    """Exports a built candidate as a linked shared library. The stock export is a ``.tar`` of
    object files that the RPC server links with ``g++ -shared`` when it loads the module, on its
    own CPU and inside the measurement's critical path; linking here spreads it over the builder
    pool. Used with ``runner.SessionRPCRunner``."""
    # Under the run's own directory when it gives one (local mode): a run stopped mid-batch
    # (Ctrl-C) leaves built-but-unmeasured candidates, which its stop then removes with it.
    parent = os.environ.get(ARTIFACT_DIR_ENV) or None
    path = os.path.join(tempfile.mkdtemp(prefix="sharetune-build-", dir=parent), "tvm_tmp_mod.so")
    mod.export_library(path)
    return path


# One built candidate: (artifact path, None, "ok") or (None, error message, "error" | "timeout").
Built = tuple[str | None, str | None, str]


def build_batch(pool: PopenPoolExecutor, f_export: Any, items: list[tuple[Any, Any, Any]],
                timeout_s: float, who: str) -> list[Built]:
    """Builds (IRModule, Target, serialized params) candidates on ``pool``, in order; shared by
    ``PooledBuilder`` and the host's build service (build/service.py)."""
    args = [(build_without_intrinsics, f_export, mod, target, params) for mod, target, params in items]
    out: list[Built] = []
    for r in pool.map_with_error_catching(lambda x: build_candidate(*x), args):
        if r.status == StatusKind.COMPLETE:
            out.append((r.value, None, "ok"))
        elif r.status == StatusKind.TIMEOUT:
            out.append((None, f"{who}: timeout, killed after {timeout_s} s", "timeout"))
        else:
            out.append((None, f"{who}: an exception occurred\n{r.value}", "error"))
    return out


@derived_object
class PooledBuilder(PyBuilder):
    def __init__(self, max_workers: int, timeout_sec: float = 60.0, max_uses: int = 64,
                 export_shared_lib: bool = False) -> None:
        super().__init__()
        self.max_workers = max_workers
        self.timeout_sec = timeout_sec
        self.f_export = export_shared if export_shared_lib else None
        self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_sec,
                                      maximum_process_uses=max_uses)

    def build(self, build_inputs: list[Any]) -> list[Any]:
        items = [(b.mod, b.target, serialize_params(b.params)) for b in build_inputs]
        return [BuilderResult(path, error) for path, error, _ in
                build_batch(self.pool, self.f_export, items, self.timeout_sec, "PooledBuilder")]

    def shutdown(self) -> None:
        self.pool.shutdown()
