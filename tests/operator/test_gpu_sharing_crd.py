"""spec.gpuSharing's mode, share and pinnedMemory as the API server enforces them (the CRD's
schema and CEL rules, docs/gpu-pools.md), agreeing with the parser. No operator needed."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sharetune.api.spec import SpecError, parse_spec

from .conftest import GROUP, PLURAL, VERSION, tuning_job

pytestmark = [pytest.mark.cluster]


def _create(k8s: Any, ns: str, name: str, **spec: Any) -> str | None:
    """None when accepted, else the API server's message."""
    try:
        client.CustomObjectsApi(k8s).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                    tuning_job(name, target="cuda", **spec))
    except ApiException as e:
        assert e.status == 422, e.body
        return str(e.body)
    return None


@pytest.mark.parametrize("spec, refusal", [
    ({"gpuSharing": {"share": 50}, "servers": {"replicas": 2, "threadPercentage": 40}},
     "servers.replicas x servers.threadPercentage must fit in gpuSharing.share"),
    ({"gpuSharing": {"share": 3}, "servers": {"replicas": 4}},
     "gpuSharing.share must give each of servers.replicas servers at least 1%"),
    ({"gpuSharing": {"mode": "devicePlugin", "share": 30}},
     "gpuSharing.share and gpuSharing.pinnedMemory are not used in mode devicePlugin"),
    ({"gpuSharing": {"mode": "exclusive", "share": 50}}, "mode exclusive books whole GPUs"),
    ({"gpuSharing": {"mode": "pool", "devicePlugin": {"resourceName": "nvidia.com/gpu.shared"}}},
     "gpuSharing.devicePlugin is only used in mode devicePlugin"),
    ({"gpuSharing": {"mode": "pool", "mps": False}}, "modes pool and devicePlugin share GPUs through MPS"),
    ({"gpuSharing": {"mode": "shared"}}, "Unsupported value"),
    ({"gpuSharing": {"share": 101}}, "should be less than or equal to 100"),
    ({"gpuSharing": {"pinnedMemory": "lots"}}, "should match"),
])
def test_the_api_server_refuses_what_the_parser_refuses(k8s, crd, ns, spec, refusal) -> None:
    message = _create(k8s, ns, "bad", **spec)
    assert message is not None and refusal in message, message
    with pytest.raises(SpecError):
        parse_spec("bad", {**tuning_job("bad", target="cuda", **spec)["spec"]})


def test_valid_sharing_is_accepted_and_the_booking_is_immutable(k8s, crd, ns) -> None:
    objs = client.CustomObjectsApi(k8s)
    for name, spec in [("pool", {"gpuSharing": {"mode": "pool", "share": 50, "pinnedMemory": "8G"}}),
                       ("dp", {"gpuSharing": {"mode": "devicePlugin",
                                              "devicePlugin": {"resourceName": "example.com/gpu"}},
                               "servers": {"replicas": 2, "threadPercentage": 30}}),
                       ("excl", {"gpuSharing": {"mode": "exclusive", "gpus": 2}}),
                       ("plain", {})]:
        assert _create(k8s, ns, name, **spec) is None, name
        body = objs.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        parse_spec(name, body["spec"])  # what the API server stored (with its defaults) parses too
    for patch, refusal in [({"gpuSharing": {"share": 60}}, "gpuSharing.share is immutable"),
                           ({"gpuSharing": {"mode": "exclusive"}}, "gpuSharing.mode is immutable"),
                           ({"gpuSharing": {"pinnedMemory": "16G"}}, "gpuSharing.pinnedMemory is immutable"),
                           # 3 servers x 25 % > 50 %: live scaling stays inside the share.
                           ({"servers": {"replicas": 3, "threadPercentage": 25}},
                            "servers.replicas x servers.threadPercentage must fit in gpuSharing.share")]:
        with pytest.raises(ApiException) as e:
            objs.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pool", {"spec": patch})
        assert e.value.status == 422 and refusal in str(e.value.body), e.value.body
    objs.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pool", {"spec": {"servers": {"replicas": 1}}})
