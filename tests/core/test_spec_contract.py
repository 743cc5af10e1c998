"""The parser and the CRD state one contract: every default, range and enum of the CRD's schema is
the parser's too, checked by behaviour (what parse_spec accepts, rejects and fills in), so a copy
that drifts in a value fails here, not only one that drifts in a field name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharetune.api.spec import SpecError, parse_spec

CRD = Path(__file__).parents[2] / "crds" / "tuningjobs.sharetune.io.yaml"
# What a field needs around it to be valid at all (its section's required siblings, or the target
# that makes a GPU field meaningful); the longest matching prefix applies.
CONTEXT: dict[str, dict[str, Any]] = {
    "spec.model.onnx.configMap": {"model": {"onnx": {"configMap": {"name": "m"}}}},
    "spec.output.s3": {"output": {"s3": {"endpoint": "http://s3.example:9000", "bucket": "b",
                                         "credentialsSecret": {"name": "creds"}}}},
    "spec.gpuSharing": {"target": "cuda"},
    "spec.servers.servingPercentage": {"target": "cuda"},
    "spec.servers.threadPercentage": {"target": "cuda"},
    "spec.gpuSharing.share": {"servers": {"replicas": 1}},
    # builders: the section's presence asks for builder pods; the autoscaler scales on a CPU request
    "spec.builders": {"builders": {}},
    # a library's mode needs a library; each location its required fields
    "spec.library.mode": {"library": {"path": "/var/lib/tuning"}},
    "spec.library.pvc": {"library": {"pvc": {"claimName": "tuning-library"}}},
    "spec.library.s3": {"library": {"s3": {"bucket": "lib", "credentialsSecret": {"name": "creds"}}}},
    "spec.builders.autoscale": {"builders": {"autoscale": {"maxReplicas": 256},
                                             "resources": {"requests": {"cpu": "1"}}}},
}


def _constrained() -> list[tuple[str, dict[str, Any]]]:
    root = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            p = f"{path}.{key}"
            if sub.get("type") != "object" and any(k in sub for k in ("default", "minimum", "maximum", "enum")):
                out.append((p, sub))
            walk(sub, p)

    walk(root["properties"]["spec"], "spec")
    return out


FIELDS = _constrained()


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _context(path: str) -> dict[str, Any]:
    ctx: dict[str, Any] = {} if path.startswith("spec.model.") else {"model": {"name": "tiny_cnn"}}
    for prefix in sorted((p for p in CONTEXT if path == p or path.startswith(p + ".")), key=len):
        ctx = _merge(ctx, CONTEXT[prefix])
    return ctx


def _spec(path: str, value: Any) -> dict[str, Any]:
    ctx = _context(path)
    keys = path.split(".")[1:]
    leaf: dict[str, Any] = {}
    node = leaf
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return _merge(ctx, leaf)


def test_the_crd_constrains_the_fields_this_test_walks() -> None:
    assert len(FIELDS) >= 25  # the walk found the schema's constrained fields (not an empty pass)


@pytest.mark.parametrize("path,schema", [f for f in FIELDS if "default" in f[1]],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_crd_default_is_the_parsers_default(path: str, schema: dict[str, Any]) -> None:
    """Writing the CRD's default explicitly means the same as leaving the field out."""
    assert parse_spec("j", _spec(path, schema["default"])) == parse_spec("j", _context(path)), path


@pytest.mark.parametrize("path,schema", [f for f in FIELDS if "minimum" in f[1] or "maximum" in f[1]],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_crd_range_is_the_parsers_range(path: str, schema: dict[str, Any]) -> None:
    for bound, outside in (("minimum", -1), ("maximum", 1)):
        if bound not in schema:
            continue
        parse_spec("j", _spec(path, schema[bound]))  # the bound itself is in range
        with pytest.raises(SpecError, match=rf"^{path}"):
            parse_spec("j", _spec(path, schema[bound] + outside))


@pytest.mark.parametrize("path,schema", [f for f in FIELDS if "enum" in f[1]],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_crd_enum_is_the_parsers_enum(path: str, schema: dict[str, Any]) -> None:
    for value in schema["enum"]:
        parse_spec("j", _spec(path, value))
    with pytest.raises(SpecError, match=rf"^{path}"):
        parse_spec("j", _spec(path, "notAValue"))
