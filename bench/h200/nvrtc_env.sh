# Source it (bash): makes this machine compile TVM's CUDA kernels for the H200 without a GPU, so
# `real_budget.py compile` can build an evaluation's models here and the device only measures them.
#   source bench/h200/nvrtc_env.sh && python bench/h200/real_budget.py compile --network resnet50 --seed 0
# NVRTC needs no GPU or driver: pip's NVRTC, cuda-bindings (TVM calls NVRTC through them), the
# CUDA headers TVM's kernels include and libcudart, pinned to the device's CUDA 13.0 (a cubin from
# a newer toolkit than the driver is not guaranteed to load). Installed once into the cache below.
# TVM looks for headers under $CUDA_PATH/include and $CUDA_PATH/targets/<triple>/include/cccl,
# which the pip layout lacks, so a small CUDA_PATH of links stands in.
# The driver library: TVM compiles kernels to cubins only when its CUDA runtime plugin
# (libtvm_runtime_cuda.so) loads, and that links libcuda.so.1: the tuner image's stand-in
# (tuner-image/nocuda-stub.sh) lets the plugin load; nothing here runs a kernel.
_cache=${XDG_CACHE_HOME:-$HOME/.cache}/sharetune-nvrtc/13.0
_py=${PYTHON:-$(git rev-parse --show-toplevel)/.venv/bin/python}
if [ ! -f "$_cache/ok" ]; then
  rm -rf "$_cache" && mkdir -p "$_cache"
  "$_py" -m pip install -q --target "$_cache/site" "cuda-bindings==13.0.3" "nvidia-cuda-nvrtc==13.0.88" \
      "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88" || return 1
  mkdir -p "$_cache/cuda/targets/x86_64-linux"
  ln -sfn "$_cache/site/nvidia/cu13/include" "$_cache/cuda/include"
  ln -sfn "$_cache/site/nvidia/cu13/include" "$_cache/cuda/targets/x86_64-linux/include"
  sh "$(git rev-parse --show-toplevel)/tuner-image/nocuda-stub.sh" "$_cache/stub" "$_py" || return 1
  touch "$_cache/ok"
fi
export CUDA_PATH=$_cache/cuda PYTHONPATH=$_cache/site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$_cache/site/nvidia/cu13/lib:$_cache/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The H200's arch (make_target reads it from the GPU where there is one): Hopper's 'a' variant.
export SHARETUNE_CUDA_ARCH=${SHARETUNE_CUDA_ARCH:-sm_90a}
unset _cache _py
