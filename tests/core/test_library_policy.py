"""spec.library as the parser reads it and the planner hands it to a job's clients and merge: the
library's volume or credentials, its scope (the job's namespace unless the chart shares another)
and its mode (the chart's default unless the job names one)."""

from __future__ import annotations

from typing import Any

import pytest

from sharetune.api.spec import SpecError, check_runs_on_cluster, parse_spec
from sharetune.library_policy import LIBRARY_MOUNT, LibraryConfig
from sharetune.planner import JobRef, plan, plan_merge

JOB = JobRef("tj", "team-a", "uid-1")


def _spec(**library: Any) -> Any:
    return parse_spec("tj", {"model": {"name": "tiny_cnn"}, "library": library})


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def _client_and_merge(spec: Any, config: LibraryConfig | None = None) -> list[dict[str, Any]]:
    clients = next(o for o in plan(JOB, spec, library=config) if o["metadata"]["name"].endswith("-clients"))
    return [_pod(clients), _pod(plan_merge(JOB, spec, library=config))]


def test_a_pvc_library_is_mounted_and_named_in_the_clients_and_the_merge() -> None:
    for pod in _client_and_merge(_spec(pvc={"claimName": "tuning", "path": "lib"}, mode="reuse")):
        (c,) = pod["containers"]
        args = c["args"]
        assert args[args.index("--library") + 1] == f"{LIBRARY_MOUNT}/lib"
        assert args[args.index("--library-scope") + 1] == "team-a"  # the job's namespace
        assert args[args.index("--library-mode") + 1] == "reuse"
        assert {"name": "library", "persistentVolumeClaim": {"claimName": "tuning"}} in pod["volumes"]
        assert {"name": "library", "mountPath": LIBRARY_MOUNT} in c["volumeMounts"]


def test_an_s3_library_has_its_own_credentials_and_the_charts_default_mode() -> None:
    spec = _spec(s3={"bucket": "lib", "prefix": "x", "endpoint": "http://s3:9000",
                     "credentialsSecret": {"name": "lib-keys"}})
    for pod in _client_and_merge(spec, LibraryConfig(default_mode="reuse")):
        (c,) = pod["containers"]
        assert c["args"][c["args"].index("--library") + 1] == "s3://lib/x"
        assert c["args"][c["args"].index("--library-mode") + 1] == "reuse"
        env = {e["name"]: e for e in c["env"]}
        assert env["SHARETUNE_LIBRARY_AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "lib-keys"
        assert env["SHARETUNE_LIBRARY_S3_ENDPOINT"]["value"] == "http://s3:9000"
        assert "AWS_ACCESS_KEY_ID" not in env  # the job's outputs (a ConfigMap here) are not the library's
    # The merge names the job (namespace, name, uid) as it adds to the library.
    args = _client_and_merge(spec)[1]["containers"][0]["args"]
    assert args[args.index("--library-job") + 1] == "team-a-tj-uid-1"


def test_no_library_or_mode_none_gives_the_pods_nothing() -> None:
    for spec in (parse_spec("tj", {"model": {"name": "tiny_cnn"}}), _spec(pvc={"claimName": "t"}, mode="none")):
        for pod in _client_and_merge(spec):
            assert "--library" not in pod["containers"][0]["args"]
            assert all(v["name"] != "library" for v in pod["volumes"])


def test_another_namespaces_scope_only_where_the_chart_shares_it() -> None:
    spec = _spec(pvc={"claimName": "t"}, scope="platform")
    with pytest.raises(SpecError, match=r"^spec.library.scope: 'platform' is another namespace's scope.*"
                                        r"library.sharedScopes"):
        _client_and_merge(spec)
    pod = _client_and_merge(spec, LibraryConfig(shared_scopes=("platform",)))[0]
    args = pod["containers"][0]["args"]
    assert args[args.index("--library-scope") + 1] == "platform"


@pytest.mark.parametrize("library,error", [
    ({"path": "/x", "pvc": {"claimName": "t"}}, "spec.library: set at most one of path, pvc, s3"),
    ({"mode": "warm"}, "spec.library.mode warm: name the library"),
    ({"mode": "always"}, "spec.library.mode: 'always' is not one of none, warm, reuse"),
    ({"pvc": {"path": "x"}}, "spec.library.pvc: claimName is required"),
    ({"s3": {"bucket": "b"}}, "spec.library.s3: bucket and credentialsSecret.name are required"),
    ({"scope": "Team_A", "path": "/x"}, "spec.library.scope: 'Team_A' is not a name"),
])
def test_a_library_it_cannot_use_names_the_field(library: dict[str, Any], error: str) -> None:
    with pytest.raises(SpecError, match="^" + error.replace(".", r"\.")):
        _spec(**library)


def test_a_local_directory_is_refused_on_a_cluster() -> None:
    with pytest.raises(SpecError, match=r"^spec.library.path is local-only.*spec.library.pvc"):
        check_runs_on_cluster(_spec(path="/home/me/lib"))
