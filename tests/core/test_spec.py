"""The TuningJob parser shared by the operator and local mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharetune.api.spec import SpecError, load_job, parse_spec

EXAMPLE = Path(__file__).parents[2] / "examples" / "tiny-cpu.yaml"


def test_example_parses_with_its_values() -> None:
    s = load_job(EXAMPLE)
    assert (s.name, s.model.name, s.target, s.shards, s.servers.replicas) == ("tiny-cpu", "tiny_cnn", "llvm", 2, 2)
    assert s.model.input_shape == (1, 3, 64, 64)
    assert not s.uses_mps  # a CPU job never starts an MPS daemon


def test_defaults() -> None:
    s = parse_spec("j", {"model": {"name": "resnet18"}, "target": "cuda"})
    assert s.mps and s.uses_mps and s.servers.thread_percentage == 100 and s.trials.total == 64


@pytest.mark.parametrize("spec, message", [
    ({}, "set exactly one of `name`"),
    ({"model": {"name": "x", "onnx": {"path": "/m.onnx"}}}, "set exactly one of `name`"),
    ({"model": {"onnx": {}}}, "set exactly one of path, url, configMap, pvc"),
    ({"model": {"name": "r"}, "target": "tpu"}, "spec.target: 'tpu' is not one of llvm, cuda"),
    ({"model": {"name": "r"}, "servers": {"threadPercentage": 0}}, "spec.servers.threadPercentage: 0 is outside [1, 100]"),
    ({"model": {"name": "r"}, "servers": {"threadPercentage": "50"}}, "expected int, got str"),
    ({"model": {"name": "r"}, "clients": {"shards": True}}, "expected int, got boolean"),
    ({"model": {"name": "r"}, "trials": {"total": 0}}, "spec.trials.total: 0 is outside"),
    ({"model": {"name": "r", "inputShape": [1, -3]}}, "inputShape: expected a list of positive integers"),
    ({"model": {"name": "r"}, "servers": {"pinnedMemoryLimit": "lots"}}, "is not a size like 4G"),
    ({"model": {"name": "r"}, "costModel": "gbdt"}, "spec.costModel"),
])
def test_errors_name_the_field(spec, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=None) as e:
        parse_spec("j", spec)
    assert message in str(e.value)


def test_manifest_errors() -> None:
    with pytest.raises(SpecError, match="expected apiVersion sharetune.io/v1alpha1"):
        load_job({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
    with pytest.raises(SpecError, match="metadata.name is required"):
        load_job({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "spec": {}})
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job("a: [unclosed")


@pytest.mark.parametrize("spec, message", [
    ({"model": {"name": "r"}, "trails": {"total": 8}}, "spec.trails: unknown field; did you mean spec.trials?"),
    ({"model": {"name": "r"}, "clients": {"shard": 2}},
     "spec.clients.shard: unknown field; did you mean spec.clients.shards?"),
    ({"model": {"onnx": {"url": "http://h/m.onnx", "sha": "x"}}},
     "spec.model.onnx.sha: unknown field; the fields of spec.model.onnx are configMap, path, pvc, url"),
])
def test_unknown_fields_are_named_with_the_nearest_known_one(spec, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as e:
        parse_spec("j", spec)
    assert str(e.value) == message
    with pytest.raises(SpecError, match=r"^specs: unknown field; did you mean spec\?$"):
        load_job({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": "x"}, "specs": {}})


def test_known_fields_are_the_crds() -> None:
    """The parser's table of fields (FIELDS) is the CRD's schema, section by section: a field the
    CRD gains must be accepted by local mode too, and local mode must not accept one it lacks."""
    import yaml

    from sharetune.api.spec import FIELDS

    crd = yaml.safe_load((Path(__file__).parents[2] / "crds" / "tuningjobs.sharetune.io.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for section, fields in FIELDS.items():
        node = root
        for key in filter(None, section.split(".")):
            node = node["properties"][key]
        assert set(node["properties"]) == fields, section


def test_local_only_and_cluster_only_sources_are_refused_with_the_fix() -> None:
    from sharetune.api.spec import check_runs_locally, check_runs_on_cluster

    path = parse_spec("j", {"model": {"onnx": {"path": "m.onnx"}}})
    pvc = parse_spec("j", {"model": {"onnx": {"pvc": {"claimName": "models", "path": "/m.onnx"}}}})
    check_runs_locally(path)
    check_runs_on_cluster(pvc)
    with pytest.raises(SpecError) as e:
        check_runs_on_cluster(path)
    assert str(e.value) == (
        "spec.model.onnx.path is local-only (a file on the machine that runs `sharetune run --local`); on a "
        "cluster use spec.model.onnx.configMap (kubectl create configmap NAME --from-file=model.onnx=FILE), "
        "spec.model.onnx.url or spec.model.onnx.pvc")
    with pytest.raises(SpecError) as e:
        check_runs_locally(pvc)
    assert str(e.value) == (
        "spec.model.onnx.pvc is cluster-only (a volume mounted into the job's pods); in local mode use "
        "spec.model.onnx.path (a file here), spec.model.onnx.url or spec.model.onnx.configMap")
