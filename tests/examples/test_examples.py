"""Every file in examples/ is what a user would apply: the real API server accepts it under strict
field validation (``kubectl apply --dry-run=server``, the session's control plane with the CRD),
local mode's parser reads it, and the ONNX examples' model sources work in local mode (the URL one
is run end to end against a local HTTP server; the ConfigMap one is read from the real API server).
"""

from __future__ import annotations

import base64
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from sharetune.api.spec import load_job

EXAMPLES = Path(__file__).parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_the_examples_are_there() -> None:
    assert {p.stem for p in FILES} >= {"tiny-cpu", "resnet50-gpu-mps", "onnx-configmap", "onnx-url", "s3-output",
                                       "serving-share", "multi-gpu"}
    for p in FILES:  # each says what it does and what to create first
        assert p.read_text().startswith("# ") and "Create first" in p.read_text() or p.stem == "tiny-cpu", p


@pytest.mark.cluster
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_example_is_accepted_by_the_api_server_and_local_mode(path: Path, cluster, crd) -> None:
    load_job(path)
    # kubectl validates strictly by default: an unknown or misspelt field would fail here.
    r = subprocess.run(["kubectl", "apply", "--dry-run=server", "--validate=strict", "-n", "default", "-f", str(path)],
                       capture_output=True, text=True, env=cluster.env(), timeout=60)
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    assert r.returncode == 0 and r.stdout.strip() == f"tuningjob.sharetune.io/{name} created (server dry run)", (
        r.stdout + r.stderr)


def _tiny_onnx(shape: list[int]) -> bytes:
    """A small user model for input ``shape`` (N, 3, H, W): it pools 8x8 first, so that even at
    224 x 224 its convolution is cheap to tune."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("AveragePool", ["input"], ["p"], kernel_shape=[8, 8], strides=[8, 8]),
             helper.make_node("Conv", ["p", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["output"])]
    g = helper.make_graph(nodes, "user-model", [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [shape[0], 8, 1, 1])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture()
def model_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback serving a small ONNX model at /m.onnx; yields its URL and the
    paths it was asked for."""
    body, asked = _tiny_onnx([1, 3, 224, 224]), []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/m.onnx", asked
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.tvm
def test_onnx_url_example_runs_in_local_mode(model_server, tmp_path: Path) -> None:
    """examples/onnx-url.yaml as it is (target llvm, 2 clients x 2 servers, its inputShape) with two
    overrides that cannot be avoided here: the URL (no network: a small model of the same input
    shape from a local HTTP server) and the budget (CI time)."""
    url, asked = model_server
    doc = yaml.safe_load((EXAMPLES / "onnx-url.yaml").read_text())
    doc["spec"]["model"]["onnx"]["url"] = url
    doc["spec"]["trials"] = {"total": 8, "perTask": 4, "perIteration": 4}
    job = tmp_path / "onnx-url.yaml"
    job.write_text(yaml.safe_dump(doc))
    out, work = tmp_path / "summary.json", tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir", str(work),
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["model"] == "m.onnx" and s["input_shape"] == [1, 3, 224, 224] and s["records"] == 8, s
    # Downloaded once into the work dir; both clients and the merge read that copy.
    assert asked == ["/m.onnx"] and len(list((work / "model").glob("*.onnx"))) == 1


@pytest.mark.cluster
def test_onnx_configmap_example_reads_the_model_through_the_kubeconfig(cluster, k8s, ns, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What `kubectl create configmap my-model --from-file=model.onnx=...` makes, read by local mode
    from the real API server (KUBECONFIG) into the file the clients load."""
    from sharetune.api.errors import ModelError
    from sharetune.api.topology import MODEL_DIR_ENV, MODEL_FILE
    from sharetune.local.model_source import prepare_local_model

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    doc = yaml.safe_load((EXAMPLES / "onnx-configmap.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    spec = load_job(job)
    with pytest.raises(ModelError) as e:
        prepare_local_model(spec, job, tmp_path / "w")
    assert str(e.value) == (f"spec.model.onnx.configMap: cannot read ConfigMap my-model in namespace {ns}: 404 "
                            f"Not Found; create it: kubectl create configmap my-model -n {ns} "
                            "--from-file=model.onnx=FILE")
    body = _tiny_onnx([1, 3, 16, 16])
    client.CoreV1Api(k8s).create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="my-model"), binary_data={"model.onnx": base64.b64encode(body).decode()}))
    env = prepare_local_model(spec, job, tmp_path / "w")
    assert env == {MODEL_DIR_ENV: str(tmp_path / "w" / "model")}
    assert (tmp_path / "w" / "model" / MODEL_FILE).read_bytes() == body


def _local(job: Path, tmp_path: Path) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir",
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=120)
    return r.returncode, " ".join((r.stdout + r.stderr).split())  # rich wraps long lines


def test_a_job_file_that_is_missing_or_not_text_is_named_in_one_line(tmp_path: Path) -> None:
    """A mistyped path or a binary file: exit 2 with one line naming the file (not "must be a YAML
    mapping", not a UnicodeDecodeError traceback), from `sharetune run` and the tuner's commands alike."""
    missing = tmp_path / "no-such-job.yaml"
    assert _local(missing, tmp_path) == (2, f"error: {missing}: no such file")
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert _local(binary, tmp_path) == (2, f"error: {binary}: not a YAML text file: byte 0x89 at offset 0 is not UTF-8")
    r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", "client", "--job", str(missing), "--work-dir",
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [f"sharetune-tuner client: error: {missing}: no such file"], \
        r.stderr


def test_local_mode_names_a_wrong_field_an_unknown_model_and_a_pvc(tmp_path: Path) -> None:
    """What a new user's first mistakes print in local mode, before any process starts."""
    doc = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    job = tmp_path / "job.yaml"
    doc["spec"]["trails"] = doc["spec"].pop("trials")
    job.write_text(yaml.safe_dump(doc))
    assert _local(job, tmp_path) == (2, f"error: {job}: spec.trails: unknown field; did you mean spec.trials?")
    doc["spec"]["trials"] = doc["spec"].pop("trails")
    doc["spec"]["model"] = {"name": "resnet-50"}
    job.write_text(yaml.safe_dump(doc))
    rc, out = _local(job, tmp_path)
    assert rc == 2 and out.endswith(  # 2: a spec error (sharetune.api.exitcodes), found by the parser
        ": spec.model.name: unknown built-in model 'resnet-50'; choose one of mobilenet_v2, resnet18, "
        "resnet34, resnet50, tiny_cnn, transformer_encoder (did you mean resnet50?), or set spec.model.onnx for "
        "your own model"), out
    assert not (tmp_path / "w" / "logs" / "tracker.log").exists()  # stopped before starting anything
    # A cluster-only source: the same refusal (the exact text: tests/core/test_spec.py).
    from sharetune.api.errors import ModelError
    from sharetune.local.model_source import prepare_local_model

    doc["spec"]["model"] = {"onnx": {"pvc": {"claimName": "models", "path": "/m.onnx"}}}
    with pytest.raises(ModelError, match=r"^spec.model.onnx.pvc is cluster-only .* in local mode use "):
        prepare_local_model(load_job(doc), job, tmp_path / "w")
