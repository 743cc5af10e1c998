"""Build-pool scaling on a real node: the same CPU TuningJob (the example's
tiny CNN, target llvm) run to Succeeded on real pods with ``spec.builders`` absent (each client
builds in its own pod: the reference arm) and with 1, 2, 4 builder pods of a fixed CPU limit each,
so that the pool's capacity is what grows from arm to arm.

    sudo .venv/bin/python bench/real_node_builders.py [--passes 2] [--arms none,1,2,4]
        (root; after bash .ci/realnode-setup.sh)

One real cluster, the chart's operator installed once; per arm one TuningJob of its own name,
deleted (and its pods gone) before the next arm. Per arm:

* trials_per_s: records tuned (status.trialsCompleted) / (the clients' Indexed Job's
  status.completionTime - status.startTime): the tuning itself, without the merge;
* wall_s: ``kubectl apply`` to phase Succeeded (pods' start, tuning, merge);
* the tuned/untuned speed-up from the job's status;
* per client its ``candidates built: remote N, here M, retried R, waited X s`` line (where its
  candidates were built: proof that the builds went to the pods).

Writes bench/results/real-node-builders.json after every arm (a pass in progress included).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from sharetune_dev.cluster import realrun
from sharetune_dev.cluster.node import RealCluster
from sharetune_dev.cluster.realrun import NAMESPACE, kubectl

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "real-node-builders.json"
BUILT = re.compile(r"candidates built: remote (\d+), here (\d+), retried (\d+), waited ([\d.]+) s")


def parse_time(ts: str | None) -> float | None:
    if not ts:
        return None
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


def job_body(a: argparse.Namespace, name: str, builders: int | None) -> dict[str, Any]:
    body = yaml.safe_load(realrun.EXAMPLE.read_text())
    body["metadata"] = {"name": name}
    s = body["spec"]
    s["trials"] = {"total": a.trials, "perTask": a.per_task, "perIteration": a.per_iteration}
    s["clients"] = {"shards": a.shards}
    s["servers"] = {"replicas": a.servers}
    if builders is not None:
        s["builders"] = {"replicas": builders, "workers": a.workers,
                         "resources": {"requests": {"cpu": a.cpu_request, "memory": "512Mi"},
                                       "limits": {"cpu": a.cpu_limit, "memory": "1Gi"}}}
    return body


def pods_of(rc: RealCluster, name: str, component: str | None = None) -> list[dict[str, Any]]:
    sel = f"sharetune.io/job={name}" + (f",app.kubernetes.io/component={component}" if component else "")
    try:
        return realrun.pods(rc, selector=sel)
    except RuntimeError:
        return []


def profile(text: str) -> dict[str, float]:
    """The client's MetaSchedule profiler table ("where the time went", in minutes) as seconds:
    the total and every phase of 2% or more of it."""
    out: dict[str, float] = {}
    if "where the time went" not in text:
        return out
    for ln in text.split("where the time went", 1)[1].splitlines():
        parts = [x.strip() for x in ln.split("|")]
        if len(parts) < 3:
            if out:
                break
            continue
        try:
            if parts[0] == "Total":
                out["Total"] = round(float(parts[1]) * 60, 1)
            elif parts[0].isdigit() and float(parts[3]) >= 2.0:
                out[parts[1]] = round(float(parts[2]) * 60, 1)
        except (ValueError, IndexError):
            continue
    return out


def logs(rc: RealCluster, pod: str) -> str:
    r = kubectl(rc, "logs", "-n", NAMESPACE, pod, check=False, timeout=60)
    return r.stdout if r.returncode == 0 else ""


class Arm:
    """One arm's run: applies the job, watches it to Succeeded, collects what it measured."""

    def __init__(self, rc: RealCluster, a: argparse.Namespace, builders: int | None, tag: str) -> None:
        self.rc, self.a, self.builders = rc, a, builders
        self.name = f"bp-{tag}-{'none' if builders is None else builders}"
        self.body = job_body(a, self.name, builders)
        self.client_logs: dict[str, str] = {}
        self.builder_logs: dict[str, str] = {}
        self.builder_pods: dict[str, dict[str, Any]] = {}
        self.clients_job: dict[str, Any] = {}
        self.peak_builders_ready = 0
        self._last_builder_logs = 0.0

    def _clients_job(self) -> dict[str, Any]:
        r = kubectl(self.rc, "get", "job", f"{self.name}-clients", "-n", NAMESPACE, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def _collect_clients(self) -> None:
        for p in pods_of(self.rc, self.name, "client"):
            n = p["metadata"]["name"]
            text = logs(self.rc, n)
            if text and (BUILT.search(text) or n not in self.client_logs):
                self.client_logs[n] = text

    def _collect_builders(self) -> None:
        for p in pods_of(self.rc, self.name, "builder"):
            n = p["metadata"]["name"]
            text = logs(self.rc, n)
            if text:
                self.builder_logs[n] = text

    def tick(self, job: dict[str, Any]) -> None:
        if self.builders is not None:
            ready = 0
            for p in pods_of(self.rc, self.name, "builder"):
                n = p["metadata"]["name"]
                cs = (p["status"].get("containerStatuses") or [{}])[0]
                self.builder_pods.setdefault(n, {"node": p["spec"].get("nodeName"), "ip": p["status"].get("podIP")})
                self.builder_pods[n].update(restarts=cs.get("restartCount", 0), phase=p["status"].get("phase"))
                if self.builder_pods[n]["ip"] is None:
                    self.builder_pods[n]["ip"] = p["status"].get("podIP")
                ready += bool(cs.get("ready"))
            self.peak_builders_ready = max(self.peak_builders_ready, ready)
            # Builder logs now and then (their pods are scaled to 0 once the shards are done).
            if time.monotonic() - self._last_builder_logs > 20:
                self._collect_builders()
                self._last_builder_logs = time.monotonic()
        cj = self._clients_job()
        if cj:
            self.clients_job = cj
            if (cj.get("status") or {}).get("completionTime") and not any(
                    BUILT.search(t) for t in self.client_logs.values()):
                self._collect_clients()
                if self.builders is not None:
                    self._collect_builders()

    def run(self) -> dict[str, Any]:
        load0 = os.getloadavg()
        t0 = time.monotonic()
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        kubectl(self.rc, "apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(self.body))
        job = realrun.wait_phase(self.rc, self.name, timeout_s=self.a.arm_timeout, on_tick=self.tick)
        wall = time.monotonic() - t0
        load1 = os.getloadavg()
        self.tick(job)
        if not self.client_logs or not any(BUILT.search(t) for t in self.client_logs.values()):
            self._collect_clients()
        st = job.get("status") or {}
        cs = self.clients_job.get("status") or {}
        start, done = parse_time(cs.get("startTime")), parse_time(cs.get("completionTime"))
        tuning_s = (done - start) if start and done else None
        trials = st.get("trialsCompleted") or 0
        clients = {}
        for pod, text in sorted(self.client_logs.items()):
            m = BUILT.search(text)
            warnings = [ln.strip() for ln in text.splitlines()
                        if "build service" in ln and ("WARNING" in ln or "lost" in ln or "no build service" in ln)]
            clients[pod] = {
                "built_line": m.group(0) if m else None,
                "remote": int(m.group(1)) if m else None, "here": int(m.group(2)) if m else None,
                "retried": int(m.group(3)) if m else None, "waited_s": float(m.group(4)) if m else None,
                "build_service_connected": sorted(set(re.findall(r"build service (\S+) connected", text))),
                "build_warnings": warnings[:6],
                "profile_s": profile(text),
            }
        builders = {}
        for pod, text in sorted(self.builder_logs.items()):
            stopped = re.search(r"build service stopped: (\d+) builds \(ok (\d+), error (\d+), timeout (\d+)\)", text)
            builders[pod] = {
                **self.builder_pods.get(pod, {}),
                "clients_connected": len(re.findall(r"build service: client \S+ connected", text)),
                "refused": len(re.findall(r"refused a connection", text)),
                "stopped_line": stopped.group(0) if stopped else None,
                "log_tail": text.strip().splitlines()[-4:],
            }
        remote = sum(c["remote"] or 0 for c in clients.values())
        here = sum(c["here"] or 0 for c in clients.values())
        return {
            "job": self.name, "builders": self.builders,
            "builder_cpu": None if self.builders is None else {"request": self.a.cpu_request, "limit": self.a.cpu_limit,
                                                               "workers": self.a.workers},
            "started_utc": started,
            "phase": st.get("phase"), "succeeded": st.get("phase") == "Succeeded",
            "trials": trials, "trials_total": st.get("trialsTotal"),
            "tuning_s": tuning_s,
            "trials_per_s": round(trials / tuning_s, 4) if tuning_s else None,
            "status_trials_per_s": st.get("trialsPerSecond"),
            "wall_s": round(wall, 1),
            "untuned_ms": st.get("untunedLatencyMs"), "tuned_ms": st.get("tunedLatencyMs"),
            "speedup": st.get("bestSpeedup"),
            "clients_job": {"startTime": cs.get("startTime"), "completionTime": cs.get("completionTime"),
                            "succeeded": cs.get("succeeded")},
            "builds": {"remote": remote, "here": here,
                       "remote_share": round(remote / (remote + here), 3) if remote + here else None,
                       "retried": sum(c["retried"] or 0 for c in clients.values())},
            "clients": clients,
            "builder_pods": builders, "peak_builders_ready": self.peak_builders_ready if self.builders else None,
            "loadavg_1m_start_end": [round(load0[0], 2), round(load1[0], 2)],
        }

    def delete(self) -> None:
        kubectl(self.rc, "delete", "tuningjob", self.name, "-n", NAMESPACE, "--wait=true", "--timeout=240s",
                check=False, timeout=300)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and pods_of(self.rc, self.name):
            time.sleep(3)


def summarize(arms: list[dict[str, Any]]) -> None:
    """Ratios within a pass: vs the 1-builder arm and vs in-client builds."""
    by = {a["builders"]: a for a in arms if a.get("trials_per_s")}
    one, local = by.get(1), by.get(None)
    for a in arms:
        tps = a.get("trials_per_s")
        a["ratio_vs_1_builder"] = round(tps / one["trials_per_s"], 3) if tps and one else None
        a["ratio_vs_in_client"] = round(tps / local["trials_per_s"], 3) if tps and local else None


def write(result: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="none,1,2,4", help="comma-separated: none (in-client builds) or a replica count")
    p.add_argument("--passes", type=int, default=1, help="passes over the arms; every second one in reverse order")
    p.add_argument("--append", action="store_true", help="keep the passes already in the results file")
    p.add_argument("--trials", type=int, default=128)
    p.add_argument("--per-task", type=int, default=32)
    p.add_argument("--per-iteration", type=int, default=16)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="build processes per builder pod")
    p.add_argument("--cpu-request", default="250m")
    p.add_argument("--cpu-limit", default="500m")
    p.add_argument("--arm-timeout", type=float, default=900)
    a = p.parse_args()
    arms = [None if x.strip() == "none" else int(x) for x in a.arms.split(",")]

    result: dict[str, Any] = {
        "what": "TuningJob trials/s with the clients' builds in their own pods vs on 1, 2, 4 builder pods "
                "(spec.builders), real kubelet + containerd node, chart's operator as a pod",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (control plane, node, every pod on them)",
        "job_spec": job_body(a, "bp-<pass>-<arm>", 1)["spec"],
        "job_spec_note": "spec.builders as shown with replicas = the arm's count; absent in the 'none' arm",
        "metric": "trials_per_s = status.trialsCompleted / (clients Indexed Job completionTime - startTime)",
        "passes": [],
    }
    if a.append and OUT.exists():
        result["passes"] = json.loads(OUT.read_text()).get("passes", [])
    def on_term(*_: object) -> None:
        raise KeyboardInterrupt  # runs the finally below: the cluster is always stopped
    signal.signal(signal.SIGTERM, on_term)
    rc = RealCluster().start()
    try:
        result["setup_s"] = round(rc.timings.get("setup_s", 0), 1)
        result["helm_install_s"] = round(realrun.helm_install(rc), 1)
        for k in range(a.passes):
            order = arms if k % 2 == 0 else list(reversed(arms))
            tag = f"p{len(result['passes']) + 1}"
            pass_ = {"pass": tag, "order": ["none" if x is None else x for x in order],
                     "job_spec": result["job_spec"],
                     "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "arms": []}
            result["passes"].append(pass_)
            for builders in order:
                arm = Arm(rc, a, builders, tag)
                print(f"[{time.strftime('%H:%M:%S')}] {arm.name}: applying", flush=True)
                try:
                    out = arm.run()
                except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as e:
                    out = {"job": arm.name, "builders": builders, "error": str(e)[-3000:]}
                pass_["arms"].append(out)
                summarize(pass_["arms"])
                write(result)
                print(f"[{time.strftime('%H:%M:%S')}] {arm.name}: {out.get('phase')} {out.get('trials')} trials in "
                      f"{out.get('tuning_s')} s = {out.get('trials_per_s')} trials/s (wall {out.get('wall_s')} s), "
                      f"builds remote/here {out.get('builds')}", flush=True)
                arm.delete()
    finally:
        rc.stop()
    write(result)
    print(json.dumps([[{k: x.get(k) for k in ("builders", "trials", "tuning_s", "trials_per_s", "wall_s", "speedup",
                                               "ratio_vs_1_builder", "ratio_vs_in_client", "builds")}
                       for x in p_["arms"]] for p_ in result["passes"]], indent=1))
    return 0 if all(x.get("succeeded") for p_ in result["passes"] for x in p_["arms"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
