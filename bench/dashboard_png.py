"""Renders docs/dashboard.png: the Grafana dashboard's CPU panels, drawn with matplotlib from the
very PromQL queries the dashboard holds (devtools/sharetune_dev/dashboard.py), answered by a real
Prometheus (Debian's package) that scraped a real local tuning run of examples/tiny-cpu.yaml.

  .venv/bin/python bench/dashboard_png.py        # ~3 min on 2 cores

Not a Grafana screenshot (no Grafana server here): same queries, same legends, plotted. GPU
panels are left out (no GPU series on a CPU machine), and so is "Jobs by phase" (an operator
series; the local run has no operator).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def query_range(port: int, expr: str, start: float, end: float, step: float) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return body["data"]["result"] if body.get("status") == "success" else []


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sharetune.api.spec import load_job
    from sharetune.local.run import LocalRun
    from sharetune.procs import ProcessGroup, free_port
    from sharetune_dev.dashboard import PANELS

    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("needs Debian's prometheus (installed by .ci/setup.sh)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="dashboard-"))
    example = ROOT / "examples" / "tiny-cpu.yaml"
    run = LocalRun(load_job(example), example, tmp / "run")
    run.start_services()
    worker = threading.Thread(target=run.run_clients, daemon=True)
    worker.start()
    deadline = time.time() + 60
    while len(run.procs) < 5 and time.time() < deadline:
        time.sleep(0.5)
    port = free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [{"job_name": "sharetune", "static_configs": [{"targets": run.metrics_targets()}]}]}))
    prom = ProcessGroup("prometheus", [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                        tmp / "prometheus.log").start()
    t0 = time.time()
    try:
        worker.join(timeout=900)
        time.sleep(4)  # one more scrape of the final values
        t1 = time.time()
        panels = [p for p in PANELS if not p.gpu_only and "operator" not in p.queries[0][0]]
        cols = 2
        rows = (len(panels) + cols - 1) // cols
        plt.style.use("dark_background")
        fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows))
        for ax, p in zip(axes.flat, panels):
            for expr, fmt in p.queries:
                for series in query_range(port, expr, t0, t1, 2):
                    xs = [float(t) - t0 for t, _ in series["values"]]
                    ys = [float(v) for _, v in series["values"]]
                    ax.plot(xs, ys, label=legend(fmt, series["metric"]), linewidth=1.4)
            ax.set_title(p.title + ("  (stat panel, shown over time)" if p.kind == "stat" else ""), fontsize=10)
            ax.set_xlabel("s since start", fontsize=8)
            ax.set_ylabel(p.unit, fontsize=8)
            ax.grid(alpha=0.25)
            if ax.lines:
                ax.legend(fontsize=6, loc="best", ncol=2)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle("sharetune dashboard (CPU panels): a real Prometheus scraping a local tiny_cnn run", fontsize=12)
        fig.tight_layout()
        out = ROOT / "docs" / "dashboard.png"
        fig.savefig(out, dpi=90)
        print(out)
    finally:
        prom.stop(grace_s=5)
        run.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
