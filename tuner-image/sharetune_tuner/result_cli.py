"""`sharetune result fetch|compile WHERE -o DIR`: a job's result as users deploy it (result.py)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# Registered only with the tuner runtime (TVM): without it `sharetune result` says what to
# install (cli._add). Found, not imported: importing TVM would slow every `sharetune` call.
if importlib.util.find_spec("tvm") is None:
    raise ModuleNotFoundError("No module named 'tvm'", name="tvm")

WHERE_HELP = ("a local-mode work dir (runs/NAME), tj/NAME (with -n), configmap://NAMESPACE/NAME or "
              "s3://BUCKET/PREFIX/result (the job's status.resultLocation)")


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("result", help="fetch a job's best records, or compile the model with them")
    acts = p.add_subparsers(dest="result_cmd", required=True)
    fetch = acts.add_parser("fetch", help="the best records as a MetaSchedule JSONDatabase (DIR/database), "
                                          "every trial (DIR/records) and the summary")
    build = acts.add_parser("compile", help="fetch, then build the model with the best records for the job's "
                                            "target: DIR/model.so, DIR/params.npz, DIR/model.json")
    for a in (fetch, build):
        a.add_argument("where", help=WHERE_HELP)
        a.add_argument("-o", "--out", type=Path, required=True, help="output directory")
        a.add_argument("-n", "--namespace", default=None, help="the TuningJob's namespace (tj/NAME); "
                                                              "default: the kubeconfig context's")
    build.add_argument("--model", type=Path, default=None,
                       help="the ONNX file the job tuned (needed when the result does not carry it: "
                            "a local path, PVC or another machine's file)")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    from .errors import TunerError
    from .result import DATABASE, LIBRARY, MODEL_JSON, PARAMS, RECORDS, compile_result, fetch, records_in

    try:
        fetched = fetch(a.where, a.out, a.namespace)
        best, trials = records_in(a.out)
        s = fetched.summary
        print(f"{a.out / DATABASE}: {best} best records (MetaSchedule JSONDatabase: "
              f"JSONDatabase(work_dir={str(a.out / DATABASE)!r})); {a.out / RECORDS}: all {trials} trials")
        if not s.is_improved:
            print("tuning did not beat TVM's defaults: the result is the untuned model (no record to apply)")
        if a.result_cmd == "compile":
            info = compile_result(fetched, a.out, a.model)
            print(f"{a.out / LIBRARY}: {info['model']} for target {info['target']} with {info['records_applied']} "
                  f"records; weights {a.out / PARAMS}; inputs {info['inputs']}; {a.out / MODEL_JSON}")
            print(f"measured by the merge: untuned {s.latency_untuned_ms} ms -> "
                  f"{s.latency_tuned_ms} ms ({s.speedup}x)")
    except TunerError as e:
        print(f"sharetune result {a.result_cmd}: error: {e}", file=sys.stderr)
        return int(e.exit_code)
    return 0
