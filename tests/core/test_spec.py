"""The TuningJob parser shared by the operator and local mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharetune.api.spec import SpecError, load_job, parse_spec

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"


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
    ({"model": {"name": "resnet18"}, "target": "tpu"}, "spec.target: 'tpu' is not one of llvm, cuda"),
    ({"model": {"name": "resnet18"}, "servers": {"threadPercentage": 0}},
     "spec.servers.threadPercentage: 0 is outside [1, 100]"),
    ({"model": {"name": "resnet18"}, "servers": {"threadPercentage": "50"}}, "expected int, got str"),
    ({"model": {"name": "resnet18"}, "clients": {"shards": True}}, "expected int, got boolean"),
    ({"model": {"name": "resnet18"}, "trials": {"total": 0}}, "spec.trials.total: 0 is outside"),
    ({"model": {"name": "resnet18", "inputShape": [1, -3]}}, "inputShape: expected a list of positive integers"),
    ({"model": {"name": "resnet18"}, "servers": {"pinnedMemoryLimit": "lots"}}, "is not a size like 4G"),
    ({"model": {"name": "resnet18"}, "costModel": "gbdt"}, "spec.costModel"),
    ({"model": {"name": "resnet18"}, "image": "tuner:1 --privileged"},
     "spec.image: 'tuner:1 --privileged' is not an image"),
    ({"model": {"name": "resnet18"}, "image": "-v"}, "spec.image: '-v' is not an image reference"),
])
def test_errors_name_the_field(spec, message) -> None:
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
    ({"model": {"name": "resnet18"}, "trails": {"total": 8}}, "spec.trails: unknown field; did you mean spec.trials?"),
    ({"model": {"name": "resnet18"}, "clients": {"shard": 2}},
     "spec.clients.shard: unknown field; did you mean spec.clients.shards?"),
    ({"model": {"onnx": {"url": "http://h/m.onnx", "sha": "x"}}},
     "spec.model.onnx.sha: unknown field; the fields of spec.model.onnx are configMap, path, pvc, url"),
])
def test_unknown_fields_are_named_with_the_nearest_known_one(spec, message) -> None:
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


# ---- spec.gpuSharing: mode, share, pinnedMemory (docs/gpu-pools.md) -------------------------------
def _cuda(**spec):
    return parse_spec("j", {"model": {"name": "resnet18"}, "target": "cuda", **spec})


def test_share_defaults_and_splits() -> None:
    # No share: the servers' sum, at most a whole GPU (the default job books one whole GPU).
    s = _cuda()
    assert (s.sharing.mode, s.sharing.share, s.sharing.share_explicit, s.sharing.pinned_memory) == (
        None, 100, False, None)
    s = _cuda(servers={"replicas": 2, "threadPercentage": 20, "pinnedMemoryLimit": "2G"})
    assert (s.sharing.share, s.sharing.pinned_memory, s.sharing.pinned_memory_mib) == (40, "4096M", 4096)
    # A share (and a memory budget) without per-server limits is split evenly between the servers.
    s = _cuda(gpuSharing={"share": 50, "pinnedMemory": "8G", "mode": "pool"}, servers={"replicas": 3})
    assert (s.servers.thread_percentage, s.servers.pinned_memory_limit) == (16, "2730M")
    assert (s.sharing.mode, s.sharing.share, s.sharing.pinned_memory_mib) == ("pool", 50, 8192)
    s = _cuda(gpuSharing={"mode": "devicePlugin", "devicePlugin": {"resourceName": "example.com/gpu"}})
    assert s.sharing.device_plugin_resource == "example.com/gpu"


@pytest.mark.parametrize("gpu_sharing, servers, message", [
    ({"share": 50}, {"replicas": 2, "threadPercentage": 40},
     "spec.servers.threadPercentage: 2 servers x 40% = 80% does not fit in spec.gpuSharing.share 50%; set "
     "threadPercentage <= 25 (or leave it out: share / replicas) or raise share"),
    ({"share": 20}, {"servingPercentage": 50},
     "spec.servers.threadPercentage (the tuning share for servers.servingPercentage 50): 2 servers x 25% = 50% does "
     "not fit in spec.gpuSharing.share 20%; set threadPercentage <= 10 or raise share"),
    ({"share": 3}, {"replicas": 4},
     "spec.gpuSharing.share: 3% cannot give each of 4 servers (servers.replicas) 1%; raise share to at least 4 or "
     "lower servers.replicas"),
    ({"pinnedMemory": "4G"}, {"replicas": 2, "pinnedMemoryLimit": "3G"},
     "spec.servers.pinnedMemoryLimit: 2 servers x 3G is more than spec.gpuSharing.pinnedMemory 4G; lower "
     "pinnedMemoryLimit (or leave it out: pinnedMemory / replicas) or raise pinnedMemory"),
    ({"mode": "shared"}, {}, "spec.gpuSharing.mode: 'shared' is not one of pool, exclusive, devicePlugin"),
    ({"mode": "pool", "mps": False}, {},
     "spec.gpuSharing.mode: pool shares GPUs through MPS, but spec.gpuSharing.mps is false; set mode: exclusive "
     "(each server owns a GPU) or drop mps: false"),
    ({"mode": "devicePlugin", "share": 30}, {},
     "spec.gpuSharing.share: not used in mode devicePlugin: the device plugin splits each GPU equally between its "
     "replicas (servers.threadPercentage and servers.pinnedMemoryLimit can only lower a server's split); drop share "
     "or use mode: pool"),
    ({"mode": "exclusive", "share": 50}, {},
     "spec.gpuSharing.share: mode exclusive books whole GPUs (100); drop share or use mode: pool"),
    ({"mode": "pool", "devicePlugin": {"resourceName": "nvidia.com/gpu.shared"}}, {},
     "spec.gpuSharing.devicePlugin: only used in mode devicePlugin (this job's mode is pool); drop it or set mode: "
     "devicePlugin"),
    ({"devicePlugin": {"resourceName": "gpu shared"}}, {},
     "spec.gpuSharing.devicePlugin.resourceName: 'gpu shared' is not an extended resource name like "
     "nvidia.com/gpu.shared"),
    ({"pinnedMemory": "lots"}, {}, "spec.gpuSharing.pinnedMemory: 'lots' is not a size like 16G or 512M"),
    ({"share": 0}, {}, "spec.gpuSharing.share: 0 is outside [1, 100]"),
    ({"sahre": 10}, {}, "spec.gpuSharing.sahre: unknown field; did you mean spec.gpuSharing.share?"),
])
def test_sharing_errors_name_the_field_and_the_fix(gpu_sharing, servers, message) -> None:
    with pytest.raises(SpecError) as e:
        _cuda(gpuSharing=gpu_sharing, servers=servers)
    assert str(e.value) == message


def test_sharing_config_from_the_charts_env() -> None:
    from sharetune.sharing import ConfigError, SharingConfig

    assert SharingConfig.from_env({}) == SharingConfig()
    c = SharingConfig.from_env({"SHARETUNE_GPU_SHARING_MODE": "exclusive", "SHARETUNE_GPU_OVERCOMMIT": "1.5",
                                "SHARETUNE_GPU_BACKFILL": "true", "SHARETUNE_GPU_POOL_IDLE_SECONDS": "60",
                                "SHARETUNE_GPU_CROSS_NAMESPACE": "false", "SHARETUNE_GPU_POOL_NAMESPACE": "ops",
                                "SHARETUNE_GPU_DEVICE_PLUGIN_RESOURCE": "example.com/gpu",
                                "SHARETUNE_GPU_POOL_TOLERATIONS": '[{"key": "nvidia.com/gpu", "operator": "Exists"}]'})
    assert (c.default_mode, c.overcommit, c.backfill, c.pool_idle_s, c.cross_namespace, c.pool_namespace,
            c.device_plugin_resource) == ("exclusive", 1.5, True, 60.0, False, "ops", "example.com/gpu")
    assert c.pool_tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists"},)
    assert c.policy.capacity == 150
    for env, message in [
        ({"SHARETUNE_GPU_OVERCOMMIT": "0.5"},
         "SHARETUNE_GPU_OVERCOMMIT='0.5' (gpuSharing.overcommit): expected a number >= 1"),
        ({"SHARETUNE_GPU_SHARING_MODE": "mps"},
         "SHARETUNE_GPU_SHARING_MODE='mps' (gpuSharing.defaultMode): expected pool or exclusive or devicePlugin"),
        ({"SHARETUNE_GPU_BACKFILL": "yes"},
         "SHARETUNE_GPU_BACKFILL='yes' (gpuSharing.backfill): expected true or false"),
        ({"SHARETUNE_GPU_POOL_TOLERATIONS": "{}"},
         "SHARETUNE_GPU_POOL_TOLERATIONS='{}' (gpuSharing.poolTolerations): expected a JSON list of tolerations"),
    ]:
        with pytest.raises(ConfigError) as e:
            SharingConfig.from_env(env)
        assert str(e.value) == message


def test_image_references_the_kubelet_takes_are_accepted_and_the_crd_agrees() -> None:
    import re

    import yaml

    from sharetune.api.spec import IMAGE_PATTERN

    for ok in ("localhost/sharetune-tuner:0.1.0", "registry.example:5000/team/tuner:1",
               "tuner@sha256:" + "a" * 64, "ghcr.io/org/tuner"):
        assert parse_spec("j", {"model": {"name": "resnet18"}, "image": ok}).raw["image"] == ok
    crd = yaml.safe_load(open(ROOT / "crds" / "tuningjobs.sharetune.io.yaml"))
    image = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["image"]
    assert image["pattern"] == IMAGE_PATTERN and re.compile(image["pattern"])  # one pattern, two checkers


def test_a_live_jobs_spec_is_parsed_once_per_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    from sharetune.api import spec as spec_mod

    calls: list[str] = []
    real = spec_mod.parse_spec
    monkeypatch.setattr(spec_mod, "parse_spec", lambda n, s: calls.append(n) or real(n, s))
    body = {"metadata": {"name": "j", "uid": "u-1", "generation": 1}, "spec": {"model": {"name": "resnet18"}}}
    first = spec_mod.spec_of(body)
    assert spec_mod.spec_of(body) is first and calls == ["j"]  # the same generation: not parsed again
    body["metadata"]["generation"] = 2
    body["spec"]["trials"] = {"total": 128}
    assert spec_mod.spec_of(body).trials.total == 128 and calls == ["j", "j"]
    bad = {"metadata": {"name": "b", "uid": "u-2", "generation": 1}, "spec": {"model": {"name": "vgg"}}}
    for _ in range(2):  # a bad spec's error comes back each time, parsed once
        with pytest.raises(SpecError, match="spec.model.name"):
            spec_mod.spec_of(bad)
    assert calls == ["j", "j", "b"]
    assert spec_mod.spec_of({"metadata": {"name": "f"},
                             "spec": {"model": {"name": "tiny_cnn"}}}).model.name == "tiny_cnn"


@pytest.mark.parametrize("image, allowed, ok", [
    ("registry.example.com/ml/tuner:1", ("registry.example.com/ml/",), True),
    ("registry.example.com/ml/tuner@sha256:" + "a" * 64, ("registry.example.com/ml/tuner",), True),
    ("reg:5000/ml/tuner:2", ("reg:5000/ml",), True),
    ("registry.example.com/mlevil/tuner:1", ("registry.example.com/ml",), False),  # a prefix ends at a '/'
    ("docker.io/library/python:3", ("registry.example.com/ml/",), False),
    ("anything:1", (), True),  # no list: any image
    (None, ("registry.example.com/ml/",), True),  # no spec.image: the operator's own
])
def test_spec_image_must_come_from_the_charts_allowed_repositories(image, allowed, ok) -> None:
    from sharetune.api.spec import check_image_allowed

    if ok:
        check_image_allowed(image, allowed)
    else:
        with pytest.raises(SpecError, match=r"^spec.image: .* is not from an allowed repository .*allowedImages"):
            check_image_allowed(image, allowed)


def test_the_operator_reads_the_allowed_repositories_from_its_environment() -> None:
    from sharetune.controller.context import allowed_images

    assert allowed_images({"SHARETUNE_ALLOWED_IMAGES": "a.io/x/, b.io/y"}) == ("a.io/x/", "b.io/y")
    assert allowed_images({"SHARETUNE_ALLOWED_IMAGES": ""}) == allowed_images({}) == ()
