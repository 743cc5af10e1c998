#!/usr/bin/env bash
# Installs what the real-node stage needs, idempotently (root): Debian's containerd, runc, CNI
# plugins, iptables/ipset/iproute2; kubelet, kube-proxy, CoreDNS, crictl, the pause binary and
# kube-router (the node's NetworkPolicy enforcer, a test fixture only) built from source (cached
# in ~/.cache/sharetune/bin); the operator and CPU tuner images (podman, from a
# debootstrapped base; OCI archives in ~/.cache/sharetune/images, imported into containerd by the
# node itself).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "[realnode-setup] needs root (containerd, kubelet, iptables)" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need containerd || missing+=(containerd)
need runc || missing+=(runc)
need iptables || missing+=(iptables)
need ipset || missing+=(ipset)
need ip || missing+=(iproute2)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[realnode-setup] apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
echo "[realnode-setup] node binaries (kubelet, kube-proxy, coredns, crictl, pause, kube-router)"
.venv/bin/python -m sharetune_dev.cluster.binaries --node
echo "[realnode-setup] images (podman; layers cached, so a rebuild after a code change is short)"
bash deploy/images/build.sh
