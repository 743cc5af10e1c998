"""The GPU an MPS daemon pod holds, published on its own pod for the pods of its clients.

The device plugin picks which of a node's GPUs the daemon's pod gets. The servers and the merge are
MPS clients in other pods that request no GPU (a request would be granted a second one), and must
see that GPU and no other. The container runtime reads ``NVIDIA_VISIBLE_DEVICES`` when it creates
a container, so the operator must know the GPU before it creates them: the daemon reads its UUID
through NVML and writes it as an annotation on its own pod (``GPU_UUID_ANNOTATION``); its
ServiceAccount may get and patch that one pod and nothing else.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from sharetune.api.gpuenv import GPU_UUID_ANNOTATION

from ..errors import TunerError

log = logging.getLogger("sharetune.gpu_identity")
RETRY_S = 10.0  # a refused or failed patch is tried again this often (the daemon serves meanwhile)


def held_gpu_uuid() -> str:
    """The UUID of the one GPU this process sees. A daemon pod holds exactly one
    (``nvidia.com/gpu: 1``); seeing several means the runtime gave it the node's, and naming one
    of them to the clients would be a guess."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count != 1:
                raise TunerError(f"the MPS daemon sees {count} GPUs, not the one its pod was given: its pod must "
                                 "request nvidia.com/gpu: 1 and get no NVIDIA_VISIBLE_DEVICES of its own")
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except TunerError:
        raise
    except Exception as e:  # NVML missing or failing: the daemon's own preflight says the same
        raise TunerError(f"cannot read the GPU's UUID through NVML: {e}") from None
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def publish(uuid: str, pod: str, namespace: str, core: Any = None) -> None:
    """Writes ``uuid`` on pod ``namespace/pod`` (the daemon's own) as ``GPU_UUID_ANNOTATION``."""
    if core is None:
        from ..store.backends import _kube_core

        core = _kube_core()
    core.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {GPU_UUID_ANNOTATION: uuid}}})


def publish_until_done(uuid: str, pod: str, namespace: str, stop: threading.Event, core: Any = None,
                       retry_s: float = RETRY_S) -> threading.Thread:
    """:func:`publish` in a thread, tried again every ``retry_s`` until it succeeds or ``stop``:
    the daemon serves meanwhile (its clients' pods wait for the annotation, not for the daemon)."""

    def run() -> None:
        while not stop.is_set():
            try:
                publish(uuid, pod, namespace, core)
                log.info("GPU %s published on pod %s/%s", uuid, namespace, pod)
                return
            except Exception as e:  # the API server away, RBAC not yet bound: say so, try again
                log.warning("cannot publish GPU %s on pod %s/%s (trying again in %.0f s): %s", uuid, namespace,
                            pod, retry_s, getattr(e, "reason", None) or e)
            stop.wait(retry_s)

    t = threading.Thread(target=run, name="publish-gpu", daemon=True)
    t.start()
    return t


def own_pod() -> tuple[str, str]:
    """This pod's name and namespace (downward API: ``POD_NAME``, ``POD_NAMESPACE``)."""
    pod, ns = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not pod or not ns:
        raise TunerError("--publish-gpu needs POD_NAME and POD_NAMESPACE (the downward API) in the environment")
    return pod, ns
