#!/usr/bin/env bash
# Builds the CPU variants of the tuner and operator images without a registry or Docker engine:
# a Debian base made with debootstrap, imported into podman, then each Dockerfile built on it
# with BASE=<that image>; finally `--help` is run in each image to prove it works.
#   bash deploy/images/build.sh            (root; ~10 min the first time, the base is cached)
# Writes localhost/sharetune-tuner:0.1.0 and localhost/sharetune-operator:0.1.0 (podman), and
# OCI archives under ~/.cache/sharetune/images/ for `ctr images import` (real-node stage).
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/sharetune/images
mkdir -p "$cache"
need=()
command -v podman >/dev/null || need+=(podman)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
# Root here lacks CAP_SYS_RESOURCE: keep container limits at or below the VM's.
# crun refuses hybrid cgroups (v1 + an empty v2 mount) on these VMs; runc runs there.
command -v runc >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc; }
limits=(--runtime "$(command -v runc)" --ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
base=localhost/sharetune-base:bookworm
if ! podman image exists "$base"; then
  if [ ! -s "$cache/bookworm-rootfs.tar" ]; then
    root=$(mktemp -d /var/tmp/sharetune-rootfs.XXXXXX)
    debootstrap --variant=minbase --include=ca-certificates bookworm "$root" http://deb.debian.org/debian
    tar -C "$root" -cf "$cache/bookworm-rootfs.tar.part" . && mv "$cache/bookworm-rootfs.tar.part" "$cache/bookworm-rootfs.tar"
    rm -rf "$root"
  fi
  podman import "$cache/bookworm-rootfs.tar" "$base"
fi
# Where this machine's egress intercepts TLS, lend its CA bundle to pip for the build only.
ca=(); [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ] && ca=(-v "$PIP_CERT:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
podman build "${limits[@]}" "${ca[@]}" --network host --build-arg BASE="$base" -f tuner-image/Dockerfile -t localhost/sharetune-tuner:0.1.0 .
podman build "${limits[@]}" "${ca[@]}" --network host --build-arg BASE="$base" -f operator/Dockerfile -t localhost/sharetune-operator:0.1.0 .
podman run --rm "${limits[@]}" localhost/sharetune-tuner:0.1.0 --help | head -3
podman run --rm "${limits[@]}" localhost/sharetune-operator:0.1.0 --help | head -3
podman run --rm "${limits[@]}" --entrypoint python localhost/sharetune-tuner:0.1.0 -c \
  'import importlib.util as u, tvm; assert u.find_spec("torch") is None; print("tvm", tvm.__version__, "no torch")'
for img in tuner operator; do
  podman save --format oci-archive -o "$cache/sharetune-$img.oci.tar" "localhost/sharetune-$img:0.1.0"
done
ls -la "$cache"
