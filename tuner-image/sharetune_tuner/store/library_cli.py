"""`sharetune library ls | export | import`: a tuning library (library.py) from the command line.
``ls`` says what it holds per target, device and GPU share; ``export`` writes the records of one of
those as a JSONDatabase stock TVM reads; ``import`` adds a stock TVM database."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from sharetune.api.topology import RECORDS_FILE, WORKLOADS_FILE

from . import library
from .library import LibraryError, Where

HELP = "list, export or import the records of a tuning library (a directory or s3://bucket/prefix)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="library_cmd", required=True)
    ls = sub.add_parser("ls", help="what the library holds, per target, device and GPU share")
    ex = sub.add_parser("export", help="one target's, device's and share's records as a JSONDatabase directory")
    im = sub.add_parser("import", help="add a JSONDatabase directory (stock TVM's) to the library")
    for s in (ls, ex, im):
        s.add_argument("uri", help="the library: a directory, or s3://BUCKET/PREFIX")
        s.add_argument("--scope", default="default", help="the library's scope (a cluster's jobs use their namespace)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ex.add_argument("out", type=Path, help="the JSONDatabase directory to write")
    im.add_argument("db", type=Path, help="the database directory to add")
    for s in (ex, im):
        s.add_argument("--device", required=True, help="the device model the records were measured on, "
                       "as `ls` shows it (e.g. 'NVIDIA H100 80GB HBM3')")
        s.add_argument("--share", type=int, default=library.FULL_SHARE, help="the GPU share (%%) they were measured "
                       "under (default 100: a whole GPU, or a CPU)")
    ex.add_argument("--target", default="", help="a part of the target that picks one when the library holds "
                    "several for that device and share (e.g. sm_90a, llvm)")
    ex.add_argument("--top-k", type=int, default=1, help="records per workload, fastest first (0: all)")
    im.add_argument("--job", default=None, help="the name the records are added under (default: one derived from "
                    "the database's content, so importing it again replaces only itself)")
    im.add_argument("--replace", action="store_true", help="replace the records an earlier import added under --job")


def _groups(found: list[library.Entry]) -> dict[tuple[str, str, int], dict[str, Any]]:
    out: dict[tuple[str, str, int], dict[str, Any]] = defaultdict(lambda: {"workloads": set(), "records": 0,
                                                                         "jobs": set()})
    for e in found:
        g = out[(e.key.target, e.key.device, e.key.share)]
        g["workloads"].add(e.key.workload)
        g["records"] += 1
        g["jobs"].add(e.job)
    return out


def _ls(a: argparse.Namespace) -> int:
    found, _ = library.entries(library.open_library(a.uri), a.scope)
    rows = [{"target": json.loads(t), "device": d, "share": s, "workloads": len(g["workloads"]),
             "records": g["records"], "jobs": len(g["jobs"])} for (t, d, s), g in sorted(_groups(found).items())]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'device':<28} {'share':>5} {'workloads':>9} {'records':>8} {'jobs':>5}  target")
    for r in rows:
        t = r["target"]
        short = " ".join(str(t[k]) for k in ("kind", "arch", "mcpu") if k in t)
        print(f"{r['device'][:28]:<28} {r['share']:>5} {r['workloads']:>9} {r['records']:>8} {r['jobs']:>5}  {short}")
    if not rows:
        print(f"(no records in scope {a.scope!r} of {a.uri})")
    return 0


def _export(a: argparse.Namespace) -> int:
    found, irs = library.entries(library.open_library(a.uri), a.scope)
    where = Where(a.device, a.share)
    targets = sorted({e.key.target for e in found if (e.key.device, e.key.share) == (where.device, where.share)
                      and a.target in e.key.target})
    if len(targets) != 1:
        seen = "; ".join(targets) or "none"
        raise LibraryError(f"--device {a.device!r} --share {a.share} --target {a.target!r} matches {len(targets)} "
                           f"targets ({seen}): name one with --target (see `sharetune library ls`)")
    chosen = library.matching(found, targets[0], where, top_k=a.top_k or None)
    n = library.export(chosen, irs, a.out)
    print(json.dumps({"out": str(a.out), "records": n, "workloads": len({e.key.workload for e in chosen})}))
    return 0


def _import(a: argparse.Namespace) -> int:
    if not (a.db / RECORDS_FILE).is_file():
        raise LibraryError(f"{a.db}: no {RECORDS_FILE}: give a JSONDatabase directory")
    job = a.job or f"imported-{_digest(a.db)}"
    lib = library.open_library(a.uri)
    uid = f"import-{job}"
    # An import is one object per name: a second database under a name already used would replace
    # the first one's records, so that takes --replace.
    if a.job and not a.replace and library.object_name(lib, a.scope, uid) in lib.names(f"{a.scope}/jobs/"):
        raise LibraryError(f"library {a.uri} (scope {a.scope}) already holds an import named {a.job!r}: give another "
                           "--job to keep both, or --replace to replace its records")
    obj = library.contribution(a.db, job, Where(a.device, a.share))
    name = library.add(lib, a.scope, uid, obj)
    print(json.dumps({"added": name, "records": len(obj["records"]), "workloads": len(obj["workloads"])}))
    return 0


def _digest(db: Path) -> str:
    """A name for a database's records: the same database always gets the same one."""
    h = hashlib.sha256()
    for f in (WORKLOADS_FILE, RECORDS_FILE):
        path = db / f
        h.update(path.read_bytes() if path.is_file() else b"")
    return h.hexdigest()[:16]


def run(a: argparse.Namespace) -> int:
    return {"ls": _ls, "export": _export, "import": _import}[a.library_cmd](a)
