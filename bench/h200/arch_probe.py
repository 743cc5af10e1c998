"""What a cluster's client learns on a GPU machine: a tracker and one server of the tuner, as a
job's pods run them, and the client-side question that names the cuda arch when the client sees
no GPU (``targets.servers_cuda_arch``), checked against NVML's answer; and the UUID an MPS daemon
publishes (``gpu_identity.held_gpu_uuid``) against ``nvidia-smi``'s. ~15 s.

  python bench/h200/arch_probe.py      # writes $OUT/arch-probe.json (bench/results/h200-arch-probe.json)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    from sharetune.gpus import nvml_cuda_arch
    from sharetune_tuner.measure.gpu_identity import held_gpu_uuid
    from sharetune_tuner.targets import servers_cuda_arch

    port, base, key = _free_port(), _free_port(), "arch-probe"
    tuner = [sys.executable, "-m", "sharetune_tuner.cli"]
    procs = [subprocess.Popen([*tuner, "tracker", "--host", "127.0.0.1", "--port", str(port)], start_new_session=True)]
    time.sleep(2)
    server = ["server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
              "--port", str(base), "--port-end", str(base + 1), "--metrics-port", "0"]
    procs.append(subprocess.Popen([*tuner, *server], start_new_session=True))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True)
    out: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "gpu": smi.stdout.strip()}
    try:
        t = time.monotonic()
        out["servers_arch"] = servers_cuda_arch("127.0.0.1", port, key, 60)
        out["servers_arch_s"] = round(time.monotonic() - t, 2)
        out["nvml_arch"] = nvml_cuda_arch()
        out["held_gpu_uuid"] = held_gpu_uuid()
    except Exception as e:  # recorded, not hidden: the probe's point is what happens
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(10)
    out["arch_agrees"] = out.get("servers_arch") == out.get("nvml_arch")
    out["uuid_agrees"] = bool(out.get("held_gpu_uuid")) and str(out["held_gpu_uuid"]) in str(out["gpu"])
    text = json.dumps(out, indent=1)
    print(text)
    Path(os.environ.get("OUT", "/tmp"), "arch-probe.json").write_text(text + "\n")
    return 0 if out["arch_agrees"] and out["uuid_agrees"] else 1


if __name__ == "__main__":
    sys.exit(main())
