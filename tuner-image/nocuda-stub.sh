#!/bin/sh
# Writes OUTDIR/libcuda.so.1: a stand-in CUDA driver library whose every function fails with
# CUDA_ERROR_NO_DEVICE (100). TVM emits cubins only when its CUDA runtime plugin
# (libtvm_runtime_cuda.so) loads, and that plugin links libcuda.so.1, which the NVIDIA runtime
# mounts only into containers that see a GPU: without it, a process that builds kernels but sees no
# GPU (a cluster's clients and builders, NVIDIA_VISIBLE_DEVICES=void) keeps CUDA source, and the
# GPU's server compiles every kernel when it loads the candidate. Nothing runs a kernel through it.
# Put OUTDIR on LD_LIBRARY_PATH only where no GPU is seen: there it would shadow the real driver.
#   usage: nocuda-stub.sh OUTDIR [PYTHON]
set -eu
out=$1
py=${2:-python3}
rt=$("$py" -c 'import os, tvm; print(os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so"))')
mkdir -p "$out"
nm -D --undefined-only "$rt" | awk '$2 ~ /^cu[A-Z]/ {sub(/@.*/, "", $2); print "int " $2 "(void) { return 100; }"}' \
    > "$out/nocuda.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$out/nocuda.c"
rm -f "$out/nocuda.c"
