"""The merge's serving report (sharetune_tuner.measure.serving) without a GPU: when it is skipped and why,
and what it writes when the per-share measurement (a subprocess on the GPU) answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sharetune_tuner.measure import serving


class FakeExecutable:
    def __init__(self) -> None:
        self.exported: list[str] = []

    def export_library(self, path: str) -> None:
        Path(path).write_bytes(b"\x7fELF")
        self.exported.append(path)


def test_cpu_target_has_no_report_and_says_why(tmp_path: Path) -> None:
    out = serving.report("llvm", False, FakeExecutable(), [], tmp_path / "s")
    assert out[serving.KEY] is None
    assert "target llvm" in out["serving_report"]["reason"]
    assert not (tmp_path / "s").exists()


def test_gpu_job_without_mps_has_no_report() -> None:
    assert "without MPS" in (serving.skip_reason("cuda", False) or "")


def test_no_daemon_no_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    assert "CUDA_MPS_PIPE_DIRECTORY is not set" in (serving.skip_reason("cuda", True) or "")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
    assert "no MPS daemon answers" in (serving.skip_reason("cuda", True, env, probe=lambda e: False) or "")
    # without the MPS control binary (a merge container) the daemon's control pipe counts
    assert serving.daemon_answers(env, control="no-such-mps-control") is False
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "control").touch()
    assert serving.daemon_answers(env, control="no-such-mps-control") is True


def test_one_measurement_per_share_under_the_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    x, w = np.ones((1, 3), "float32"), np.arange(6, dtype="float32").reshape(2, 3)
    seen: list[int] = []

    def measure(lib: Path, inputs: Path, pct: int) -> dict[str, Any]:
        assert lib.exists()
        with np.load(inputs) as z:  # the input first, then the params, as the VM takes them
            assert np.array_equal(z["arr_0"], x) and np.array_equal(z["arr_1"], w)
        seen.append(pct)
        return {"median_ms": 100.0 / pct} if pct != 25 else {"error": "exit 1: boom"}

    ex = FakeExecutable()
    out = serving.report("cuda", True, ex, [x, w], tmp_path / "serving", measure=measure, probe=lambda e: True)
    assert seen == list(serving.SERVING_PCTS)
    assert out[serving.KEY] == {"10": 10.0, "25": None, "50": 2.0, "75": 100.0 / 75, "100": 1.0}
    rep = out["serving_report"]
    assert rep["reason"] is None and rep["per_pct"]["25"]["error"] == "exit 1: boom"
    assert rep["pipe_dir"] == str(tmp_path / "pipe")
    assert not (tmp_path / "serving").exists()  # the exported model and inputs are removed


def test_measure_one_sets_the_share_and_reports_failures(tmp_path: Path) -> None:
    # no GPU here: the subprocess fails, and that comes back as an error, not an exception
    res = serving.measure_one(tmp_path / "missing.so", tmp_path / "missing.npz", 50, timeout_s=120)
    assert "error" in res
