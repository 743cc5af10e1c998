"""`sharetune-tuner result fetch|compile WHERE -o DIR` (what `sharetune result` runs, in a child
process): a job's result as users deploy it (result.py). Its arguments are `sharetune result`'s
(``sharetune.result_args``)."""

from __future__ import annotations

import argparse
import sys


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
