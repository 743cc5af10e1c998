"""Environment every GPU process of sharetune gets (pods and local mode alike). Pure constants."""

from __future__ import annotations

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: a program that uses it can take a shared
# host's GPUs out of service for a long time, and tuning never needs it.
NO_MULTICAST: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}
