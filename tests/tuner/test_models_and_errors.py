"""Model loading (zoo, ONNX files) and the clear errors users get for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from sharetune.gpus import gpu_count
from sharetune_tuner.errors import ModelError, TargetError
from sharetune_tuner.model import loader as model_mod
from sharetune_tuner.model.tasks import extract
from sharetune_tuner.targets import make_target

from .conftest import EXAMPLE, example_job

pytestmark = pytest.mark.tvm


# GFLOP = 2 x the published multiply-accumulates: ResNet-18 1.82 G, ResNet-34 3.67 G (the same 23
# workloads as ResNet-18, more of each), ResNet-50 4.1 G,
# MobileNetV2 0.30 G; the encoder 2 layers x (4 d^2 + 2 d ff) x seq + attention = 0.055 G;
# tiny_cnn's three convs 7.1 + 37.7 + 75.5 M. Task counts pin the fusion result.
@pytest.mark.parametrize("name, tasks, gflop", [
    ("resnet18", 23, 3.64), ("resnet34", 23, 7.34), ("resnet50", 34, 8.21), ("mobilenet_v2", 46, 0.62),
    ("transformer_encoder", 11, 0.0553), ("tiny_cnn", 8, 0.12),
])
def test_zoo_models_import_and_extract(name: str, tasks: int, gflop: float) -> None:
    m = model_mod.load(name=name)
    got = extract(m.mod, make_target("llvm", 1))
    assert len(got) == tasks
    assert sum(t.info.flops * t.info.weight for t in got) / 1e9 == pytest.approx(gflop, rel=0.02)
    assert len({t.info.workload_hash for t in got}) == len(got)


def test_the_spec_names_the_zoos_models() -> None:
    """spec.model.name is checked against the parser's list (no TVM in the parser): the zoo's."""
    from sharetune.api.spec import BUILTIN_MODELS
    from sharetune_tuner.model.zoo import ZOO

    assert set(BUILTIN_MODELS) == set(ZOO)


def test_the_model_check_without_tvm_knows_the_zoos_models() -> None:
    """Local mode checks spec.model.name before any tuner process starts (sharetune.models: no
    ONNX, no TVM): it accepts exactly the zoo's models, with the tuner loader's message."""
    from sharetune.models import BUILTIN_MODELS, check_builtin
    from sharetune_tuner.model.zoo import ZOO

    assert set(ZOO) == set(BUILTIN_MODELS)
    for name in ZOO:
        check_builtin(name)
    with pytest.raises(ModelError, match=r"unknown built-in model 'resnet19'; choose one of mobilenet_v2, resnet18, "
                                         r"resnet34, resnet50, tiny_cnn, transformer_encoder "
                                         r"\(did you mean resnet18\?\)"):
        model_mod.load(name="resnet19")


def test_onnx_file_roundtrip(tmp_path: Path) -> None:
    import onnx

    from sharetune_tuner.model.zoo import tiny_cnn

    f = tmp_path / "m.onnx"
    onnx.save(tiny_cnn([1, 3, 16, 16]), str(f))
    m = model_mod.load(onnx_path=f)
    assert m.input_shape == (1, 3, 16, 16) and m.name == "m"
    assert len(extract(m.mod, make_target("llvm", 1))) >= 4


def test_configmap_and_pvc_models_load_from_the_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    from sharetune.api.spec import parse_spec
    from sharetune_tuner.model.zoo import tiny_cnn

    monkeypatch.setenv("SHARETUNE_MODEL_DIR", str(tmp_path))
    cm = parse_spec("j", {"model": {"onnx": {"configMap": {"name": "m", "key": "net.onnx"}}}})
    with pytest.raises(ModelError, match="ConfigMap m key net.onnx"):
        model_mod.load_for_spec(cm.model)
    onnx.save(tiny_cnn([1, 3, 16, 16]), str(tmp_path / "model.onnx"))  # what the pod's mount shows
    assert model_mod.load_for_spec(cm.model).input_shape == (1, 3, 16, 16)
    (tmp_path / "sub").mkdir()
    (tmp_path / "model.onnx").rename(tmp_path / "sub" / "b.onnx")
    pvc = parse_spec("j", {"model": {"onnx": {"pvc": {"claimName": "models", "path": "/sub/b.onnx"}}}})
    assert model_mod.load_for_spec(pvc.model).input_shape == (1, 3, 16, 16)


def test_bad_inputs_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="unknown built-in model 'resnet9000'; choose one of"):
        model_mod.load(name="resnet9000")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    with pytest.raises(ModelError, match="is not a valid ONNX model"):
        model_mod.load(onnx_path=bad)
    with pytest.raises(ModelError, match="does not exist"):
        model_mod.load(onnx_path=tmp_path / "missing.onnx")
    with pytest.raises(ModelError, match="cannot download model from http://127.0.0.1:9/"):
        model_mod.load(url="http://127.0.0.1:9/model.onnx", cache_dir=tmp_path)
    with pytest.raises(TargetError, match="unknown target 'tpu'"):
        make_target("tpu")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_errors_have_messages_and_exit_codes(tmp_path: Path) -> None:
    r = run_cli("client", "--job", str(example_job(tmp_path, model={"name": "nope"})),
                "--work-dir", str(tmp_path / "w"))
    assert r.returncode == 2 and "unknown built-in model 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("client", "--job", str(example_job(tmp_path, target="tpu")), "--work-dir", str(tmp_path / "w"))
    assert r.returncode == 2 and "spec.target: 'tpu' is not one of llvm, cuda" in r.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    r = run_cli("client", "--job", str(example_job(tmp_path, model={"onnx": {"path": str(bad)}})),
                "--work-dir", str(tmp_path / "w"))
    assert r.returncode == 3 and "is not a valid ONNX model" in r.stderr
    # No tracker listening: a clear error after the wait, not a hang or a traceback.
    r = run_cli("client", "--job", str(EXAMPLE), "--work-dir", str(tmp_path / "w"), "--tracker", "127.0.0.1:9",
                "--tracker-wait", "3")
    assert r.returncode == 5 and "no RPC server reachable through tracker 127.0.0.1:9" in r.stderr
    r = run_cli("client", "--job", str(EXAMPLE), "--work-dir", str(tmp_path / "w"), "--shard", "7")
    assert r.returncode == 2 and "--shard 7 is outside [0, 2)" in r.stderr


def test_mps_daemon_without_mps_fails_clearly() -> None:
    r = run_cli("mps-daemon", "--control-binary", "nvidia-cuda-mps-control-not-here")
    assert r.returncode == 6
    assert "nvidia-cuda-mps-control-not-here not found: CUDA MPS needs the NVIDIA driver" in r.stderr


@pytest.mark.skipif(bool(__import__("shutil").which("nvidia-cuda-mps-control")), reason="this host has MPS")
def test_local_run_without_mps_stops_at_the_daemon_with_its_error(tmp_path: Path) -> None:
    """A GPU job in local mode on a host without MPS: the run stops as soon as the MPS daemon
    exits, with the daemon's own error, and starts no server without MPS."""
    spec = example_job(tmp_path, target="cuda", servers={"replicas": 2, "threadPercentage": 50})
    # A GPU's arch, so that a host without a GPU gets as far as the daemon too.
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(spec), "--local", "--workdir",
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SHARETUNE_CUDA_ARCH": "sm_80"})
    out = r.stdout + r.stderr
    assert r.returncode == 6, out  # the daemon's own exit code: an MPS error
    assert "mps-daemon exited" in out and "nvidia-cuda-mps-control not found" in out, out
    assert not list((tmp_path / "w" / "logs").glob("server-*.log")), "a server started without MPS"


@pytest.mark.skipif(gpu_count() > 0, reason="this host has a GPU")
def test_a_local_cuda_job_without_a_gpu_fails_at_once(tmp_path: Path) -> None:
    """target cuda on a machine without a GPU: `sharetune run` stops before it starts a process,
    with NVML's answer and the target error's exit code, instead of restarting clients that each
    find no GPU."""
    job = example_job(tmp_path, target="cuda", gpuSharing={"mps": False}, servers={"replicas": 1},
                      clients={"shards": 1})
    env = {k: v for k, v in os.environ.items() if k != "SHARETUNE_CUDA_ARCH"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir",
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=60, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "failed: target cuda needs an NVIDIA GPU, but NVML found none (" in out, out
    assert not list((tmp_path / "w" / "logs").glob("*.log")), out  # nothing started, so nothing restarted
    assert time.monotonic() - t0 < 15
