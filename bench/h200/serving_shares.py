"""The serving report on the H200: it measures every share for real.

Two arms, back to back, each under a job's MPS daemon started with the product's own command
line (``sharetune.api.commands.mps_daemon``) for a job tuned at 25%:
  - ``now``: the daemon as the job runs it now (no default thread percentage);
  - ``before``: the same daemon with ``--thread-percentage 25`` (what the job's daemon got before).
In each, the merge's serving report (``sharetune_tuner.measure.serving.report``) measures ResNet-18 (TVM's
default schedules: no tuning needed to see the cap) at 10, 25, 50, 75 and 100% in one process per
share, and records the SMs each process saw. Writes ``$OUT/h200-serving-shares.json``.

  python3 bench/h200/serving_shares.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from common import RUN_ROOT, ProcessGroup, log, tuner_env


def arm(name: str, extra_daemon_args: list[str], executable, arrays) -> dict:
    from sharetune.api import commands
    from sharetune.api.spec import parse_spec
    from sharetune_tuner.measure import serving
    from sharetune_tuner.measure.mps import READY

    spec = parse_spec("serving", {"model": {"name": "resnet18"}, "target": "cuda",
                                  "servers": {"threadPercentage": 25}})
    mps = RUN_ROOT / f"serving-{name}"
    pipe, logs = mps / "pipe", mps / "log"
    env = tuner_env({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)})
    daemon = ProcessGroup(f"mps-{name}", [sys.executable, "-m", "sharetune_tuner.cli",
                                          *commands.mps_daemon(spec, str(pipe), str(logs)), *extra_daemon_args],
                          mps / "daemon.log", env=env).start()
    try:
        deadline = time.monotonic() + 30
        while not (pipe / READY).exists() and time.monotonic() < deadline and daemon.alive():
            time.sleep(0.2)
        if not (pipe / READY).exists():
            raise RuntimeError(f"daemon {name} not ready:\n{daemon.tail()}")
        os.environ.update({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)})
        t0 = time.monotonic()
        rep = serving.report("cuda", True, executable, arrays, mps / "work")
        rep["seconds"] = round(time.monotonic() - t0, 1)
        rep["daemon_args"] = [*commands.mps_daemon(spec, str(pipe), str(logs)), *extra_daemon_args]
        return rep
    finally:
        daemon.stop()


def main() -> int:
    os.environ.update(tuner_env())
    from sharetune_tuner.merge import compile_with
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.targets import make_target

    model = load(name="resnet18")
    executable = compile_with(None, model, make_target("cuda"))
    arrays = [model.sample_input(0), *[p.numpy() for p in model.params]]
    out = {"what": "serving report shares under the job's daemon, tuned at 25%", "arms": {}}
    for name, extra in (("now", []), ("before", ["--thread-percentage", "25"])):
        out["arms"][name] = arm(name, extra, executable, arrays)
        per = out["arms"][name]["serving_report"]["per_pct"]
        log(f"{name}: " + ", ".join(f"{p}% {v.get('sms_seen')} SMs {v.get('median_ms')} ms" for p, v in per.items()))
    dest = Path(os.environ.get("OUT", "/tmp")) / "h200-serving-shares.json"
    dest.write_text(json.dumps(out, indent=2))
    print(json.dumps({n: {p: v.get("sms_seen") for p, v in a["serving_report"]["per_pct"].items()}
                      for n, a in out["arms"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
