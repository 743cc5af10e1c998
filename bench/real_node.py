"""Real-node end-to-end benchmark: node setup cold and warm, and the example CPU TuningJob from
``kubectl apply`` to Succeeded on real pods (operator installed by the chart, as a pod).

    sudo .venv/bin/python bench/real_node.py      (root; after bash .ci/realnode-setup.sh)

* cold_setup_s: control plane + containerd with an empty image store (every image imported and
  unpacked) + kubelet Ready + kube-proxy synced + CoreDNS ready. Binaries and image archives are
  already built (their build times are the setup scripts', not the node's).
* warm_setup_s: the same with the image store kept in ~/.cache/sharetune/containerd (images
  imported once per build).
* wall_s: ``kubectl apply -f examples/tiny-cpu.yaml`` to phase Succeeded.

Writes bench/results/real-node-e2e.json.
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from sharetune_dev.cluster import realrun
from sharetune_dev.cluster.node import RealCluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "real-node-e2e.json"


def main() -> int:
    result: dict = {"machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
                    "job": str(realrun.EXAMPLE.relative_to(ROOT))}
    store = Path(tempfile.mkdtemp(prefix="stn-store-"))
    try:
        t0 = time.monotonic()
        rc = RealCluster(image_store=store).start()
        result["cold_setup_s"] = round(time.monotonic() - t0, 1)
        result["cold_breakdown_s"] = {k: round(v, 1) for k, v in rc.timings.items() if v is not None}
        rc.stop()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    RealCluster().start().stop()  # fills the kept image store if this build is not in it yet
    t0 = time.monotonic()
    rc = RealCluster().start()
    result["warm_setup_s"] = round(time.monotonic() - t0, 1)
    result["warm_breakdown_s"] = {k: round(v, 1) for k, v in rc.timings.items() if v is not None}
    try:
        result["helm_install_s"] = round(realrun.helm_install(rc), 1)
        name = yaml.safe_load(realrun.EXAMPLE.read_text())["metadata"]["name"]
        t0 = time.monotonic()
        realrun.kubectl(rc, "apply", "-n", realrun.NAMESPACE, "-f", str(realrun.EXAMPLE))
        job = realrun.wait_phase(rc, name)
        result["wall_s"] = round(time.monotonic() - t0, 1)
        st = job["status"]
        result.update({
            "succeeded": st.get("phase") == "Succeeded", "phase": st.get("phase"),
            "trials": st.get("trialsCompleted"), "trials_total": st.get("trialsTotal"),
            "trials_per_s": st.get("trialsPerSecond"), "untuned_ms": st.get("untunedLatencyMs"),
            "tuned_ms": st.get("tunedLatencyMs"), "best_speedup": st.get("bestSpeedup"),
            "result_location": st.get("resultLocation"),
        })
    finally:
        rc.stop()
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result.get("succeeded") else 1


if __name__ == "__main__":
    raise SystemExit(main())
