"""Status as a pure function: observed StatefulSet and pods -> counts, endpoints, conditions, reason."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

import pytest

from encoderpool_operator import status
from encoderpool_operator.spec import Pool

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)  # 10 minutes after the fixtures' timestamps
PROBE_AFTER = 120.0
UNSCHEDULABLE_MSG = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def crash(exit_code: int, message: str = "", reason: str = "Error", waiting: str = "CrashLoopBackOff") -> dict[str, Any]:
    return {"ready": False, "started": False, "restartCount": 4,
            "state": {"waiting": {"reason": waiting, "message": "back-off 5m0s"}},
            "lastState": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}}}


# name: (replicas, pods as kwargs for the pod fixture, sts kwargs,
#        expected: reason, Ready, Progressing reason, Degraded reason, ready/updated counts, message part)
TABLE: dict[str, tuple[int, list[dict[str, Any]], dict[str, Any], tuple[str, bool, str, str, int, int, str]]] = {
    "all ready": (2, [{}, {}], {}, ("Ready", True, "Complete", "AsExpected", 2, 2, "2/2 pods ready")),
    "rolling update": (2, [{}, {"revision": "enc-rev1"}], {"update_revision": "enc-rev2", "current_revision": "enc-rev1"},
                       ("RollingUpdate", False, "RollingUpdate", "AsExpected", 2, 1, "1/2 pods on revision enc-rev2")),
    "scaling up": (3, [{}], {}, ("Scaling", False, "Scaling", "AsExpected", 1, 1, "1 pods, 3 wanted")),
    "scaling down": (1, [{}, {}], {}, ("Scaling", False, "Scaling", "AsExpected", 2, 2, "2 pods, 1 wanted")),
    "loading model": (2, [{}, {"ready": False, "container": {"ready": False, "started": False,
                                                            "state": {"running": {"startedAt": "2026-01-01T00:09:00Z"}}}}],
                      {}, ("Starting", False, "Starting", "AsExpected", 1, 2, "loading the model")),
    "unschedulable": (2, [{}, {"ready": False, "scheduled": False, "unschedulable_message": UNSCHEDULABLE_MSG}], {},
                      ("Unschedulable", False, "Starting", "Unschedulable", 1, 2, "Insufficient nvidia.com/gpu")),
    "model load exit code": (1, [{"ready": False, "container": crash(3, "Traceback ...")}], {},
                             ("ModelLoadFailed", False, "Starting", "ModelLoadFailed", 0, 1, "exit code 3")),
    "model path missing": (1, [{"ready": False, "container": crash(
        1, "invalid setting ENCODER_MODEL_PATH / --model-path: no config.json in '/models/x'")}], {},
        ("ModelLoadFailed", False, "Starting", "ModelLoadFailed", 0, 1, "no config.json")),
    # A pod that served before its load refused the checkpoint: the 2 KiB tail is mostly its log,
    # and the reason is the CLI's last line.
    "model load refused after start": (1, [{"ready": False, "container": crash(
        3, "pache/m'}, 'parallel': {'dp_size': 1}}\nINFO:     Uvicorn running on http://0.0.0.0:30000\n" * 20
        + "encoder-pod: model load failed: cannot serve model_type 'ovis2': the generic path cannot load it")}], {},
        ("ModelLoadFailed", False, "Starting", "ModelLoadFailed", 0, 1,
         "exit code 3: encoder-pod: model load failed: cannot serve model_type 'ovis2'")),
    # A data-parallel pod stopped by a rank given up: the line names the worker and the count.
    "data-parallel rank given up": (1, [{"ready": False, "container": crash(
        3, "INFO encoder_pod.parallel.front: data-parallel front stopped\nINFO:     Finished server process [7]\n"
        + "encoder-pod: model load failed: worker 1: SafetensorError: Error while deserializing header: "
        "header too large (after 5 failed starts)")}], {},
        ("ModelLoadFailed", False, "Starting", "ModelLoadFailed", 0, 1,
         "exit code 3: encoder-pod: model load failed: worker 1: SafetensorError: Error while deserializing "
         "header: header too large (after 5 failed starts)")),
    "crash loop": (1, [{"ready": False, "container": crash(139, "Segmentation fault")}], {},
                   ("CrashLoop", False, "Starting", "CrashLoop", 0, 1, "last exit code 139")),
    "out of memory": (1, [{"ready": False, "container": crash(137, reason="OOMKilled")}], {},
                      ("CrashLoop", False, "Starting", "CrashLoop", 0, 1, "raise spec.resources.limits.memory")),
    # What a kubelet really reports (seen on kind): the message is the log tail, whose start-up
    # lines name the model path; an OOM kill is still no model load failure.
    "out of memory, log tail naming the model": (1, [{"ready": False, "container": crash(
        137, "INFO encoder_pod.server: effective settings: {'model': {'model_path': '/opt/m'}}", reason="OOMKilled")}], {},
        ("CrashLoop", False, "Starting", "CrashLoop", 0, 1, "(OOMKilled); raise spec.resources.limits.memory")),
    "image pull": (1, [{"ready": False, "container": {"ready": False, "started": False, "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope:1\""}}}}], {},
        ("ImagePullFailed", False, "Starting", "ImagePullFailed", 0, 1, "nope:1")),
    "missing secret": (1, [{"ready": False, "container": {"ready": False, "started": False, "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": "secret \"hf\" not found"}}}}], {},
        ("ContainerConfigError", False, "Starting", "ContainerConfigError", 0, 1, "secret \"hf\" not found")),
    "probe failing": (1, [{"ready": False, "ready_since": "2026-01-01T00:05:00Z", "container": {
        "ready": False, "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}}], {},
        ("ProbeFailing", False, "Starting", "ProbeFailing", 0, 1, "GET /health")),
    "probe failing briefly": (1, [{"ready": False, "ready_since": "2026-01-01T00:09:30Z", "container": {
        "ready": False, "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}}], {},
        ("Starting", False, "Starting", "AsExpected", 0, 1, "loading the model")),
    "recovered after a model load failure": (1, [{"container": {**crash(3), "ready": True, "started": True,
        "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}}}}], {},
        ("Ready", True, "Complete", "AsExpected", 1, 1, "1/1 pods ready")),
    "statefulset not observed": (2, [{}, {}], {"generation": 3, "observed": 2},
                                 ("WaitingForStatefulSet", False, "WaitingForStatefulSet", "AsExpected", 2, 2, "not yet observed")),
    "scaled to zero": (0, [], {}, ("ScaledToZero", True, "Complete", "AsExpected", 0, 0, "0/0 pods ready")),
    "terminating pod": (1, [{}, {"deleting": True}], {}, ("Ready", True, "Complete", "AsExpected", 1, 1, "1/1")),
    "worst problem wins": (3, [{"ready": False, "container": crash(139)},
                               {"ready": False, "scheduled": False, "unschedulable_message": UNSCHEDULABLE_MSG}, {}], {},
                           ("Unschedulable", False, "Starting", "Unschedulable", 1, 3, "1 of 3 pods; enc-1")),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_status_table(case: str, make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]],
                      statefulset: Callable[..., dict[str, Any]]) -> None:
    replicas, pods, sts_kwargs, expected = TABLE[case]
    reason, ready, progressing, degraded, ready_count, updated, message = expected
    pool = make_pool({"model": "/m", "replicas": replicas}, generation=4)
    out = status.compute_status(pool, statefulset(**sts_kwargs), [pod(i, **kw) for i, kw in enumerate(pods)],
                                NOW, PROBE_AFTER)
    conditions = {c["type"]: c for c in out["conditions"]}
    assert out["reason"] == reason
    assert conditions["Ready"]["status"] == ("True" if ready else "False")
    assert conditions["Progressing"]["reason"] == progressing
    assert conditions["Progressing"]["status"] == ("False" if progressing == "Complete" else "True")
    assert conditions["Degraded"]["reason"] == degraded
    assert conditions["Degraded"]["status"] == ("False" if degraded == "AsExpected" else "True")
    assert (out["readyReplicas"], out["updatedReplicas"]) == (ready_count, updated)
    assert message in out["message"]
    assert out["observedGeneration"] == 4 and all(c["observedGeneration"] == 4 for c in out["conditions"])
    assert out["readyText"] == f"{ready_count}/{replicas}"


def test_endpoints_are_the_ready_pods_dns_names_in_ordinal_order(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    pool = make_pool({"model": "/m", "replicas": 11, "port": 31000})
    pods = [pod(i, ready=i != 2) for i in (10, 2, 0, 1)]
    out = status.compute_status(pool, statefulset(), pods, NOW, PROBE_AFTER)
    assert out["endpoints"] == [f"http://enc-{i}.enc.ml.svc:31000" for i in (0, 1, 10)]
    assert out["selector"] == "encoderpool.io/pool=enc" and out["replicas"] == 4


def url(i: int) -> str:
    return f"http://enc-{i}.enc.ml.svc:30000"


def test_endpoints_never_mix_revisions_during_a_rollout(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    """Routers must not mix old- and new-checkpoint embeddings: one revision at a time."""
    pool = make_pool({"model": "/m", "replicas": 3})
    sts = statefulset(update_revision="enc-rev2", current_revision="enc-rev1")
    # The new pod is still loading: the old revision serves alone.
    starting = {"ready": False, "started": False, "state": {"running": {"startedAt": "2026-01-01T00:09:00Z"}}}
    loading = [pod(0, revision="enc-rev1"), pod(1, revision="enc-rev1"), pod(2, ready=False, container=starting)]
    out = status.compute_status(pool, sts, loading, NOW, PROBE_AFTER)
    assert out["endpoints"] == [url(0), url(1)] and out["reason"] == "RollingUpdate"
    # One new pod is ready: from now on only the new revision is listed.
    switched = [pod(0, revision="enc-rev1"), pod(1, revision="enc-rev1"), pod(2)]
    out = status.compute_status(pool, sts, switched, NOW, PROBE_AFTER)
    assert out["endpoints"] == [url(2)]
    # status.revisions lets a router see both, told apart, the update revision first.
    assert out["revisions"] == [
        {"name": "enc-rev2", "updated": True, "replicas": 1, "readyReplicas": 1, "endpoints": [url(2)]},
        {"name": "enc-rev1", "updated": False, "replicas": 2, "readyReplicas": 2, "endpoints": [url(0), url(1)]},
    ]
    assert (out["updateRevision"], out["currentRevision"], out["updatedReadyReplicas"]) == ("enc-rev2", "enc-rev1", 1)


def test_a_canary_partition_serves_both_revisions_and_is_ready(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    pool = make_pool({"model": "/m", "replicas": 3, "rollout": {"partition": 2}})
    sts = statefulset(update_revision="enc-rev2", current_revision="enc-rev1")
    pods = [pod(0, revision="enc-rev1"), pod(1, revision="enc-rev1"), pod(2)]
    out = status.compute_status(pool, sts, pods, NOW, PROBE_AFTER)
    conditions = {c["type"]: c for c in out["conditions"]}
    assert out["reason"] == "Canary" and conditions["Ready"]["status"] == "True"
    assert conditions["Progressing"]["status"] == "False" and conditions["Progressing"]["reason"] == "Canary"
    assert "2 held on the previous revision by spec.rollout.partition=2" in out["message"]
    assert out["endpoints"] == [url(0), url(1), url(2)]
    # The canary pod itself not yet replaced: the rollout is under way.
    out = status.compute_status(pool, sts, [pod(0, revision="enc-rev1"), pod(1, revision="enc-rev1"),
                                            pod(2, revision="enc-rev1")], NOW, PROBE_AFTER)
    assert out["reason"] == "RollingUpdate" and "partition=2" in out["message"]


def test_endpoints_use_each_pods_own_port(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    """Mid-rollout of a port change, the old pods still listen on the old port."""
    pool = make_pool({"model": "/m", "replicas": 1, "port": 31000})
    old = pod(0)
    old["spec"] = {"containers": [{"name": "encoder", "ports": [{"name": "http", "containerPort": 30000}]}]}
    out = status.compute_status(pool, statefulset(), [old], NOW, PROBE_AFTER)
    assert out["endpoints"] == ["http://enc-0.enc.ml.svc:30000"]


def test_a_stalled_rollout_passes_its_progress_deadline(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    spec = {"model": "/m", "replicas": 2, "rollout": {"progressDeadlineSeconds": 60}}
    sts = statefulset(update_revision="enc-rev2", current_revision="enc-rev1")
    pods = [pod(0, revision="enc-rev1"), pod(1, ready=False, scheduled=False, unschedulable_message=UNSCHEDULABLE_MSG)]
    first = status.compute_status(make_pool(spec), sts, pods, NOW, PROBE_AFTER)
    assert first["lastProgressTime"] == "2026-01-01T00:10:00Z"
    later = datetime(2026, 1, 1, 0, 10, 59, tzinfo=timezone.utc)
    assert status.compute_status(make_pool(spec, status=first), sts, pods, later, PROBE_AFTER) == first
    stalled = status.compute_status(make_pool(spec, status=first), sts, pods,
                                    datetime(2026, 1, 1, 0, 11, 1, tzinfo=timezone.utc), PROBE_AFTER)
    conditions = {c["type"]: c for c in stalled["conditions"]}
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["Progressing"]["reason"] == "ProgressDeadlineExceeded"
    assert "no progress for over 60s" in conditions["Progressing"]["message"]
    assert stalled["reason"] == "Unschedulable", "the pod's own problem stays the headline"
    # Progress (the new pod became ready) restarts the clock; done, the clock goes.
    moved = status.compute_status(make_pool(spec, status=stalled), sts, [pod(0, revision="enc-rev1"), pod(1)],
                                  datetime(2026, 1, 1, 0, 12, tzinfo=timezone.utc), PROBE_AFTER)
    assert moved["lastProgressTime"] == "2026-01-01T00:12:00Z"
    done = status.compute_status(make_pool(spec, status=moved), sts, [pod(0), pod(1)], NOW, PROBE_AFTER)
    assert "lastProgressTime" not in done and done["reason"] == "Ready"


def test_the_deadline_defaults_past_the_startup_budget(make_pool: Callable[..., Pool]) -> None:
    assert status.deadline_seconds(make_pool({"model": "/m", "startupTimeoutSeconds": 600})) == 900
    assert status.deadline_seconds(make_pool({"model": "/m", "rollout": {"progressDeadlineSeconds": 45}})) == 45


def test_apply_failed_still_reports_the_pods_that_run(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    pool = make_pool({"model": "/m", "replicas": 2}, status={"readyReplicas": 0, "endpoints": []})
    extras = status.Extras(failure=("ApplyFailed", "StatefulSet: spec.template.spec.containers[1].image: Required value"))
    out = status.compute_status(pool, statefulset(), [pod(0), pod(1)], NOW, PROBE_AFTER, extras)
    assert out["reason"] == "ApplyFailed" and "Required value" in out["message"]
    assert out["readyReplicas"] == 2 and out["endpoints"] == [url(0), url(1)]
    conditions = {c["type"]: c for c in out["conditions"]}
    assert conditions["Degraded"]["status"] == "True" and conditions["Ready"]["reason"] == "ApplyFailed"


def test_spec_fields_not_in_effect_are_named(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    pool = make_pool({"model": "/m"})
    out = status.compute_status(pool, statefulset(), [pod(0)], NOW, PROBE_AFTER)
    applied = {c["type"]: c for c in out["conditions"]}["SpecApplied"]
    assert applied["status"] == "True" and "ignoredFields" not in out
    extras = status.Extras(ignored=["spec.podTemplate.spec.containers[encoder].command"],
                           notes=["spec.podTemplate sets fields the operator owns: ..."])
    out = status.compute_status(pool, statefulset(), [pod(0)], NOW, PROBE_AFTER, extras)
    applied = {c["type"]: c for c in out["conditions"]}["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "ProtectedFieldOverride")
    assert out["ignoredFields"] == ["spec.podTemplate.spec.containers[encoder].command"]
    assert out["reason"] == "Ready", "a protected override does not make the pool unready"


def test_the_image_is_recorded(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    extras = status.Extras(image="r/enc:1-cuda", image_default_for="cuda")
    out = status.compute_status(make_pool({"model": "/m"}), statefulset(), [pod(0)], NOW, PROBE_AFTER, extras)
    assert (out["image"], out["imageDefaultFor"]) == ("r/enc:1-cuda", "cuda")


def test_missing_statefulset(make_pool: Callable[..., Pool]) -> None:
    out = status.compute_status(make_pool({"model": "/m"}), None, [], NOW, PROBE_AFTER)
    assert out["reason"] == "WaitingForStatefulSet" and out["replicas"] == 0


def test_last_transition_time_moves_only_when_status_flips(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    loading = {"ready": False, "container": {"ready": False, "started": False,
                                             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}}
    first = status.compute_status(make_pool({"model": "/m"}), statefulset(), [pod(0, **loading)], NOW, PROBE_AFTER)
    later = datetime(2026, 1, 1, 0, 20, tzinfo=timezone.utc)  # within the progress deadline
    same = status.compute_status(make_pool({"model": "/m"}, status=first), statefulset(), [pod(0, **loading)],
                                 later, PROBE_AFTER)
    assert same == first, "an unchanged pool must produce an identical status (no write)"
    flipped = status.compute_status(make_pool({"model": "/m"}, status=first), statefulset(), [pod(0)], later, PROBE_AFTER)
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times["Ready"] == "2026-01-01T00:20:00Z"
    assert times["Degraded"] == "2026-01-01T00:10:00Z"


def test_merge_patch() -> None:
    assert status.merge_patch({"a": 1}, {"a": 1}) is None
    assert status.merge_patch({"a": 1, "old": 2}, {"a": 3}) == {"status": {"old": None, "a": 3}}


@pytest.mark.parametrize(
    ("before", "after", "events"),
    [
        ({}, {"reason": "Starting", "message": "m"}, [status.Event("Normal", "Starting", "m")]),
        ({"reason": "Starting"}, {"reason": "Ready", "message": "2/2"}, [status.Event("Normal", "Ready", "2/2")]),
        ({"reason": "Ready"}, {"reason": "Unschedulable", "message": "q"}, [status.Event("Warning", "Unschedulable", "q")]),
        ({"reason": "Ready"}, {"reason": "InvalidSpec", "message": "x"}, [status.Event("Warning", "InvalidSpec", "x")]),
        ({"reason": "Ready", "message": "a"}, {"reason": "Ready", "message": "b"}, []),
        ({"reason": "Ready"}, {"reason": "WaitingForStatefulSet", "message": "w"}, []),
    ],
)
def test_events_on_transitions_only(before: dict[str, Any], after: dict[str, Any], events: list[status.Event]) -> None:
    assert status.transitions_of(before, after) == events


def test_failed_status_keeps_the_last_observation() -> None:
    previous = {"replicas": 2, "readyReplicas": 2, "endpoints": ["http://a"], "reason": "Ready"}
    out = status.failed_status(previous, 5, "InvalidSpec", "spec.port: too small", NOW)
    assert out["endpoints"] == ["http://a"] and out["readyReplicas"] == 2 and out["observedGeneration"] == 5
    conditions = {c["type"]: c for c in out["conditions"]}
    assert conditions["Degraded"]["status"] == "True" and conditions["Degraded"]["reason"] == "InvalidSpec"
    assert conditions["Ready"]["message"] == "spec.port: too small"


def test_every_status_field_is_in_the_crd(
    openapi: dict[str, Any], make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]],
    statefulset: Callable[..., dict[str, Any]]
) -> None:
    """A field missing from the CRD's status schema would be pruned by the API server."""
    schema = openapi["properties"]["status"]["properties"]
    extras = status.Extras(image="i", image_default_for="cuda", ignored=["spec.x"], notes=["x"])
    sts = statefulset(update_revision="enc-rev2", current_revision="enc-rev1")
    out = status.compute_status(make_pool({"model": "/m", "replicas": 2}), sts, [pod(0, revision="enc-rev1"), pod(1)],
                                NOW, PROBE_AFTER, extras)
    assert {"revisions", "lastProgressTime", "image", "ignoredFields"} <= set(out)
    assert set(out) <= set(schema)
    assert set(out["revisions"][0]) <= set(schema["revisions"]["items"]["properties"])
    for cond in out["conditions"]:
        assert set(cond) <= set(schema["conditions"]["items"]["properties"])


def test_status_messages_do_not_change_with_time(
    make_pool: Callable[..., Pool], pod: Callable[..., dict[str, Any]], statefulset: Callable[..., dict[str, Any]]
) -> None:
    """A clock in a message would rewrite status (and post nothing useful) on every resync."""
    failing = {"ready": False, "ready_since": "2026-01-01T00:00:00Z",
               "container": {"ready": False, "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}}
    pool = make_pool({"model": "/m"})
    a = status.compute_status(pool, statefulset(), [pod(0, **failing)], NOW, PROBE_AFTER)
    b = status.compute_status(pool, statefulset(), [pod(0, **failing)], datetime(2026, 1, 2, tzinfo=timezone.utc), PROBE_AFTER)
    assert a["message"] == b["message"] and a["reason"] == "ProbeFailing"
