"""Control-plane benchmark: cold and warm binary builds, and harness startup to ready.

    .venv/bin/python bench/control_plane.py            # warm build (cache hit) + 5 startups
    .venv/bin/python bench/control_plane.py --cold     # + a truly cold build in empty Go caches

The cold build uses fresh GOMODCACHE/GOCACHE and binary cache directories, so it downloads and
compiles everything as a new machine does. Writes bench/results/control-plane.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "control-plane.json"


def build(env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "sharetune_dev.cluster.binaries"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--startups", type=int, default=5)
    a = ap.parse_args()
    prev = json.loads(OUT.read_text()) if OUT.exists() else {}
    result = {"machine_cpus": os.cpu_count()}
    if a.cold:
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, "GOMODCACHE": f"{d}/mod", "GOCACHE": f"{d}/build", "XDG_CACHE_HOME": f"{d}/xdg"}
            result["cold_build_s"] = round(build(env), 1)
            subprocess.run(["chmod", "-R", "u+w", d], check=False)  # the module cache is read-only
    else:
        result["cold_build_s"] = prev.get("cold_build_s")
        if "cold_build_note" in prev:
            result["cold_build_note"] = prev["cold_build_note"]
    result["warm_build_s"] = round(build(dict(os.environ)), 2)

    from sharetune_dev.cluster.harness import LocalCluster

    times = []
    for _ in range(a.startups):
        c = LocalCluster()
        c.start()
        times.append(c.startup_s)
        c.stop()
    result["startup_s"] = round(statistics.median(times), 2)
    result["startup_s_all"] = [round(t, 2) for t in times]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
