"""Environment every GPU process of sharetune gets (pods and local mode alike). Pure constants."""

from __future__ import annotations

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: a program that uses it can take a shared
# host's GPUs out of service for a long time, and tuning never needs it.
NO_MULTICAST: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}

# An MPS daemon pod's GPU, by UUID, as the daemon read it through NVML: an annotation on the
# daemon's own pod. The servers and the merge (MPS clients in other pods, holding no GPU of their
# own) are created with exactly that GPU in NVIDIA_VISIBLE_DEVICES (sharetune_tuner.measure.gpu_identity).
GPU_UUID_ANNOTATION = "sharetune.io/gpu-uuid"
# What a container that must see no GPU asks the NVIDIA runtime for (CUDA images default to "all").
NO_GPU_DEVICES = "void"
# Where the tuner image keeps its stand-in CUDA driver library (tuner-image/nocuda-stub.sh): on
# LD_LIBRARY_PATH in a cuda job's pods that build kernels but see no GPU, never in one that sees one.
NO_DRIVER_LIB_DIR = "/opt/sharetune/nocuda"
