"""Using a job's result (`sharetune result fetch|compile`): from a local-mode work dir, an S3
location and the result ConfigMap, to a MetaSchedule database and a model library that runs.

The result is a real merge's output (merge_and_report on a shard holding one hand-made record that
beats TVM's default: test_never_worse's, delivered as the tuned model), laid out as a local-mode
work dir: a real tuning run would add ~80 s for the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from sharetune.api.summary import Summary
from sharetune.api.topology import RECORDS_FILE, RESULT_OBJECT, SUMMARY_FILE, s3_job_prefix

from .test_never_worse import FAST_TASK, _fast, _record_shard, _spec

pytestmark = pytest.mark.tvm

LOAD_TUNED = Path(__file__).parents[2] / "examples" / "load_tuned.py"
README = Path(__file__).parents[2] / "README.md"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-mode work dir whose result/ holds a merged, tuned (improved) result."""
    from sharetune_tuner.merge import merge_and_report

    tmp = tmp_path_factory.mktemp("result")
    spec = _spec(tmp)
    _record_shard(spec, tmp / "run" / "shards" / "shard-0", {FAST_TASK: _fast})
    s = asdict(merge_and_report(spec, [tmp / "run" / "shards" / "shard-0"], tmp / "run" / "result"))
    assert s["improved"] is True and s["best_records"] == 1, s
    return tmp / "run"


def _best(db_dir: Path) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=str(db_dir)).get_all_tuning_records()


def test_local_result_compiles_to_a_library_that_runs_tuned(run_dir: Path, tmp_path: Path) -> None:
    import numpy as np
    import tvm

    from sharetune_tuner.merge import compare, compile_with, model_timer, outputs_match, run_once
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.targets import make_target

    out = tmp_path / "tuned"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "result", "compile", str(run_dir), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 best records" in r.stdout and "model.so" in r.stdout
    # (a) The best records, loadable as TVM users load a database; every trial next to them.
    assert len(_best(out / "database")) == 1 and (out / "records" / RECORDS_FILE).read_text().strip()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    info = json.loads((out / "model.json").read_text())
    assert info["inputs"] == [{"name": "input", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert info["target"] == "llvm" and info["records_applied"] == 1 and info["improved"] is True
    assert info["speedup"] == summary["speedup"] > 1 and info["latency_tuned_ms"] == summary["latency_tuned_ms"]
    # (b) The library: what the merge's compile gives, loaded as a user loads it.
    model = load(name="tiny_cnn", input_shape=(1, 3, 64, 64))
    dev = tvm.cpu()
    lib = tvm.runtime.load_module(str(out / "model.so"))  # what relax.VirtualMachine(lib, dev) runs
    params = np.load(out / "params.npz")
    assert list(params.files) == info["param_names"] and len(params.files) == len(model.params) == 8
    x = model.sample_input(seed=1)
    untuned = compile_with(None, model, make_target("llvm"))
    ok, err = outputs_match(run_once(untuned, model, x, dev), run_once(lib, model, x, dev))
    assert ok, err
    # The record is applied: the merge measured this model 47 -> 19 ms (the conv 34 -> 3.6 ms).
    t_untuned, t_lib = compare([model_timer(untuned, model, x, dev, 100), model_timer(lib, model, x, dev, 100)])
    assert t_lib < 0.8 * t_untuned, (t_lib, t_untuned)
    # The README's snippet runs it: examples/load_tuned.py is that code (DIR from argv, not ./tuned).
    snippet = README.read_text().split("## Using the result")[1].split("```python\n")[1].split("```")[0]
    example = LOAD_TUNED.read_text().split('"""\n', 1)[1]  # after the docstring

    def code(text: str, skip: tuple[str, ...] = ()) -> list[str]:
        return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("out = ", *skip))]

    assert code(snippet) == code(example, ("import sys", "print(", "      f"))
    r = subprocess.run([sys.executable, str(LOAD_TUNED), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tiny_cnn: output [1, 10]" in r.stdout, r.stdout + r.stderr


def test_result_from_s3(run_dir: Path, tmp_path: Path, s3_env: Any) -> None:
    from sharetune_tuner.result import fetch
    from sharetune_tuner.store.backends import S3Store, pack

    prefix = s3_job_prefix("runs", "ns1", "job1")  # where the merge pod puts it (topology)
    S3Store("results", prefix).put(RESULT_OBJECT, pack(run_dir / "result", ["records", "best", SUMMARY_FILE]))
    # The status's location (.../result) and the job's store prefix both name it.
    for where in (f"s3://results/{prefix}/{RESULT_OBJECT}", f"s3://results/{prefix}"):
        f = fetch(where, tmp_path / "s3")
        assert f.summary.improved is True and len(_best(tmp_path / "s3" / "database")) == 1
    with pytest.raises(Exception, match=r"no result at s3://results/runs/ns1/other/result.tar.gz"):
        fetch("s3://results/runs/ns1/other/result", tmp_path / "none")


@pytest.mark.cluster
def test_result_from_the_result_configmap_and_a_missing_job(run_dir: Path, tmp_path: Path,
                                                           cluster, k8s, crd, monkeypatch) -> None:
    from kubernetes import client

    from sharetune.api.topology import configmap_uri, object_configmap
    from sharetune_tuner.result import ResultError, fetch
    from sharetune_tuner.store.backends import ConfigMapStore, pack

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    cm = object_configmap("cmjob", RESULT_OBJECT)  # cmjob-result, as the operator names it
    client.CoreV1Api(k8s).create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=cm)))
    try:
        ConfigMapStore("default", "cmjob").put(RESULT_OBJECT, pack(run_dir / "result", ["best", SUMMARY_FILE]))
        f = fetch(configmap_uri("default", cm), tmp_path / "cm")  # what status.resultLocation says
        assert f.summary.best_records == 1 and len(_best(tmp_path / "cm" / "database")) == 1
        with pytest.raises(ResultError, match="no TuningJob 'nope' in namespace 'default'"):
            fetch("tj/nope", tmp_path / "none", "default")
    finally:
        client.CoreV1Api(k8s).delete_namespaced_config_map(cm, "default")


def test_bad_locations_are_one_line_errors(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "result", "fetch", str(tmp_path), "-o",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KUBECONFIG": str(tmp_path / "none")})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "holds no result: expected a local-mode work dir" in r.stderr
    from sharetune_tuner.result import ResultError, fetch

    with pytest.raises(ResultError, match="bad ConfigMap location"):
        fetch("configmap://only-ns", tmp_path / "o")
    with pytest.raises(ResultError, match="unknown result location 'ftp://x'"):
        fetch("ftp://x", tmp_path / "o")


def test_the_status_fetch_command_is_one_the_cli_takes() -> None:
    import shlex

    from sharetune.cli import build_parser
    from sharetune.controller.status import result_fields

    cmd = result_fields(Summary(records=4, speedup=2.0), "team-a", "resnet")["fetchCommand"]
    assert cmd == "sharetune result fetch tj/resnet -n team-a -o DIR"
    a = build_parser().parse_args(shlex.split(cmd)[1:])
    assert (a.result_cmd, a.where, a.namespace, str(a.out)) == ("fetch", "tj/resnet", "team-a", "DIR")
    assert "fetchCommand" not in result_fields(Summary(records=4, speedup=2.0))


def test_a_local_run_of_a_model_file_compiles_from_its_work_dir_alone(run_dir: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A local job whose model is `spec.model.onnx.path` (relative, as users write it): the work
    dir keeps the job with the path made absolute, so `result compile WORKDIR` needs no --model."""
    import shutil

    from sharetune.local.run import keep_job
    from sharetune_tuner.model.zoo import ZOO

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets").mkdir()
    import onnx
    onnx.save(ZOO["tiny_cnn"].build([1, 3, 64, 64]), str(tmp_path / "nets" / "mine.onnx"))
    job = tmp_path / "mine.yaml"
    job.write_text("apiVersion: sharetune.io/v1alpha1\nkind: TuningJob\nmetadata: {name: mine}\n"
                   "spec:\n  model: {onnx: {path: nets/mine.onnx}, inputShape: [1, 3, 64, 64]}\n  target: llvm\n")
    work = tmp_path / "run"
    shutil.copytree(run_dir, work)
    from sharetune.api.spec import load_job

    kept = keep_job(load_job(job), work)
    assert str(tmp_path / "nets" / "mine.onnx") in kept.read_text()
    summary = json.loads((work / "result" / SUMMARY_FILE).read_text())
    (work / "result" / SUMMARY_FILE).write_text(json.dumps({**summary, "model": "mine"}))  # not a built-in

    monkeypatch.chdir("/")  # compiled from anywhere
    out = tmp_path / "tuned"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "result", "compile", str(work), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads((out / "model.json").read_text())
    assert info["inputs"][0]["shape"] == [1, 3, 64, 64] and (out / "model.so").is_file()
