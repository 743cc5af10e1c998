"""A MOCK of NVIDIA's NVML bindings (``pynvml``), for the process kubelet's GPU mock only.

``podsim`` runs a cuda job's MPS daemon pod on a CPU machine (``cpu_for_gpu``, a GPU mock its test
names) with this directory first on ``PYTHONPATH``: the daemon reads "its" GPU's UUID here
(``FAKE_NVML_UUID``) and publishes it as it would on a GPU node. Nothing else is provided.
"""

from __future__ import annotations

import os


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if index != 0:
        raise IndexError(index)
    return 0


def nvmlDeviceGetUUID(handle: int) -> str:
    return os.environ["FAKE_NVML_UUID"]
