"""One reconcile, against an in-memory stand-in for the API server.

The stand-in is a mock, allowed here because this tier runs without a control plane; it keeps
only what reconcile relies on (apply creates or replaces, generation moves with the spec, a
status subresource, uid preconditions). tests/e2e runs the same reconcile against a real
kube-apiserver, StatefulSet controller and scheduler.
"""

from __future__ import annotations

import copy
import itertools
from datetime import datetime, timezone
from typing import Any, Callable

import pytest

from encoderpool_operator import errors
from encoderpool_operator.diff import without
from encoderpool_operator.reconcile import KINDS, Snapshot, reconcile
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.status import Event

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
Key = tuple[str, str, str]


class FakeApi:
    """Objects by (kind, namespace, name), with a log of every write."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.events: list[Event] = []
        self.pods: list[dict[str, Any]] = []
        self.reject: set[str] = set()
        self.reads: list[tuple[str, str]] = []
        self.dry_runs: list[tuple[str, str]] = []
        self.drops: set[tuple[str, ...]] = set()  # manifest paths the "API server" silently drops
        self._uids = itertools.count(100)

    def add(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(obj)

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get("EncoderPool", namespace, name)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(("GET", kind))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        kind, meta = manifest["kind"], manifest["metadata"]
        if kind in self.reject:
            raise errors.RejectedError(f"{kind} is invalid", status=422, resource=kind)
        if dry_run:
            self.dry_runs.append((kind, meta["name"]))
            return copy.deepcopy(manifest)
        key = (kind, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        new = without(copy.deepcopy(manifest), tuple(self.drops))
        new["metadata"]["uid"] = old["metadata"]["uid"] if old else f"uid-{next(self._uids)}"
        generation = old["metadata"]["generation"] if old else 0
        changed = old is None or old.get("spec") != new.get("spec")
        new["metadata"]["generation"] = generation + 1 if changed else generation
        new["status"] = old.get("status", {}) if old else {}
        self.objects[key] = new
        self.writes.append(("apply", kind, meta["name"]))  # a PATCH, even when it changes nothing
        return copy.deepcopy(new)

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            raise errors.NotFoundError("gone", status=404)
        if obj["metadata"]["uid"] != uid:
            raise errors.ConflictError("uid precondition failed", status=409)
        del self.objects[(kind, namespace, name)]
        self.writes.append(("delete", kind, name))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.reads.append(("LIST", "Pod"))
        return copy.deepcopy(self.pods)

    def patch_pool_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        pool = self.objects[("EncoderPool", namespace, name)]
        merged = {**pool.get("status", {}), **patch["status"]}
        pool["status"] = {k: v for k, v in merged.items() if v is not None}
        self.writes.append(("status", "EncoderPool", name))
        return copy.deepcopy(pool)

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        self.events.append(event)

    def controller_observes(self, ready_pods: int = 0, pod: Callable[..., dict[str, Any]] | None = None) -> None:
        """Play the StatefulSet controller: observe the latest generation, create ready pods."""
        sts = self.objects[("StatefulSet", "ml", "enc")]
        sts["status"] = {"observedGeneration": sts["metadata"]["generation"], "updateRevision": "enc-rev2",
                         "currentRevision": "enc-rev2"}
        if pod is not None:
            self.pods = [pod(i) for i in range(ready_pods)]


@pytest.fixture
def api(pool_body: Callable[..., dict[str, Any]]) -> FakeApi:
    fake = FakeApi()
    fake.add(pool_body({"model": "/m", "replicas": 2}))
    return fake


def run(api: FakeApi, settings: OperatorSettings, snapshot: Snapshot | None = None) -> Any:
    return reconcile(api, "ml", "enc", settings, NOW, snapshot)


def cached(api: FakeApi) -> Snapshot:
    """What a watch cache would hold right now."""
    children = {kind: copy.deepcopy(api.objects.get((kind, "ml", "enc"))) for kind in KINDS}
    return Snapshot(children, copy.deepcopy(api.pods))


def test_first_reconcile_creates_children_and_waits_for_the_controller(api: FakeApi, settings: OperatorSettings) -> None:
    outcome = run(api, settings)
    order = [("apply", "StatefulSet", "enc"), ("apply", "Service", "enc"), ("apply", "PodDisruptionBudget", "enc")]
    assert [w for w in api.writes if w[0] == "apply"] == order
    assert api.dry_runs == [(kind, "enc") for _, kind, _ in order], "every write is dry-run first"
    assert outcome.waiting and not outcome.failed
    assert api.objects[("EncoderPool", "ml", "enc")]["status"]["reason"] == "WaitingForStatefulSet"
    assert api.events == [], "a wait of a second is not worth an Event"


def test_reconcile_is_idempotent(api: FakeApi, settings: OperatorSettings, pod: Callable[..., dict[str, Any]]) -> None:
    run(api, settings)
    api.controller_observes(2, pod)
    outcome = run(api, settings)
    assert outcome.ready and outcome.status["endpoints"] == ["http://enc-0.enc.ml.svc:30000",
                                                             "http://enc-1.enc.ml.svc:30000"]
    api.writes.clear()
    api.events.clear()
    api.dry_runs.clear()
    again = run(api, settings)
    assert api.writes == [] and api.events == [] and api.dry_runs == [], "nothing changed: no request that writes"
    assert again.status == outcome.status and again.writes == 0


def test_with_a_watch_cache_a_no_op_reconcile_reads_only_the_pool(
        api: FakeApi, settings: OperatorSettings, pod: Callable[..., dict[str, Any]]) -> None:
    run(api, settings)
    api.controller_observes(2, pod)
    run(api, settings, cached(api))
    api.reads.clear()
    api.writes.clear()
    run(api, settings, cached(api))
    assert api.reads == [("GET", "EncoderPool")], "children and pods come from the cache; the pool is read afresh"
    assert api.writes == [], "nothing changed"


def test_an_apply_refused_in_the_dry_run_changes_nothing(
        api: FakeApi, settings: OperatorSettings, pod: Callable[..., dict[str, Any]]) -> None:
    """A new port with a bad pod template: the Service must not move to the port while pods stay."""
    run(api, settings)
    api.controller_observes(2, pod)
    run(api, settings)
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["port"] = 31000
    api.reject.add("StatefulSet")
    api.writes.clear()
    outcome = run(api, settings)
    assert outcome.status["reason"] == "ApplyFailed"
    assert [w for w in api.writes if w[0] != "status"] == []
    assert api.objects[("Service", "ml", "enc")]["spec"]["ports"][0]["port"] == 30000
    assert outcome.status["readyReplicas"] == 2 and len(outcome.status["endpoints"]) == 2


def test_a_field_the_cluster_drops_is_reported_and_not_reapplied(
        api: FakeApi, settings: OperatorSettings, pod: Callable[..., dict[str, Any]]) -> None:
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["rollout"] = {"maxUnavailable": 2}
    api.drops.add(("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"))  # feature gate off
    run(api, settings)
    api.controller_observes(2, pod)
    outcome = run(api, settings)
    assert outcome.status["ignoredFields"] == ["spec.rollout.maxUnavailable"]
    applied = {c["type"]: c for c in outcome.status["conditions"]}["SpecApplied"]
    assert applied["reason"] == "FeatureGateMissing" and "MaxUnavailableStatefulSet" in applied["message"]
    api.writes.clear()
    run(api, settings)
    assert api.writes == [], "the dropped field must not make every resync re-apply"


def test_autoscaling_owns_an_hpa_and_removes_it_when_turned_off(api: FakeApi, settings: OperatorSettings) -> None:
    pool = api.objects[("EncoderPool", "ml", "enc")]
    pool["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 5, "targetAverageValue": 3}
    run(api, settings)
    hpa = api.objects[("HorizontalPodAutoscaler", "ml", "enc")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "name": "enc"}
    del pool["spec"]["autoscaling"]
    run(api, settings)
    assert ("HorizontalPodAutoscaler", "ml", "enc") not in api.objects


def test_a_protected_override_is_kept_out_and_reported(api: FakeApi, settings: OperatorSettings) -> None:
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["podTemplate"] = {
        "spec": {"containers": [{"name": "encoder", "command": ["sleep", "infinity"]}]}}
    outcome = run(api, settings)
    container = api.objects[("StatefulSet", "ml", "enc")]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["encoder-pod", "serve"]
    applied = {c["type"]: c for c in outcome.status["conditions"]}["SpecApplied"]
    assert applied["status"] == "False" and applied["reason"] == "ProtectedFieldOverride"
    assert "spec.containers[encoder].command" in applied["message"]


def test_an_operator_upgrade_with_a_new_default_image_does_not_roll_existing_pools(
        api: FakeApi, pool_body: Callable[..., dict[str, Any]]) -> None:
    old = OperatorSettings.model_validate({"default_image": "r/enc:1-cuda"})
    new = OperatorSettings.model_validate({"default_image": "r/enc:2-cuda"})

    def image(name: str = "enc") -> str:
        return api.objects[("StatefulSet", "ml", name)]["spec"]["template"]["spec"]["containers"][0]["image"]

    reconcile(api, "ml", "enc", old, NOW)
    assert image() == "r/enc:1-cuda" and api.objects[("EncoderPool", "ml", "enc")]["status"]["image"] == "r/enc:1-cuda"
    api.writes.clear()
    reconcile(api, "ml", "enc", new, NOW)
    assert image() == "r/enc:1-cuda" and not [w for w in api.writes if w[1] == "StatefulSet"]
    api.add(pool_body({"model": "/m"}, name="fresh"))
    reconcile(api, "ml", "fresh", new, NOW)
    assert image("fresh") == "r/enc:2-cuda", "a new pool gets the new default"
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["followDefaultImage"] = True
    reconcile(api, "ml", "enc", new, NOW)
    assert image() == "r/enc:2-cuda", "the explicit opt-in moves it"


def test_scaling_to_one_removes_the_pdb(api: FakeApi, settings: OperatorSettings) -> None:
    run(api, settings)
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["replicas"] = 1
    run(api, settings)
    assert ("PodDisruptionBudget", "ml", "enc") not in api.objects
    assert ("delete", "PodDisruptionBudget", "enc") in api.writes


def test_a_pdb_of_someone_else_is_left_alone(api: FakeApi, settings: OperatorSettings) -> None:
    api.objects[("EncoderPool", "ml", "enc")]["spec"]["replicas"] = 1
    api.add({"kind": "PodDisruptionBudget", "metadata": {"name": "enc", "namespace": "ml", "uid": "x",
                                                         "ownerReferences": [{"controller": True, "uid": "other"}]}})
    run(api, settings)
    assert ("PodDisruptionBudget", "ml", "enc") in api.objects


def test_drift_is_undone(api: FakeApi, settings: OperatorSettings) -> None:
    run(api, settings)
    api.objects[("StatefulSet", "ml", "enc")]["spec"]["replicas"] = 9
    del api.objects[("Service", "ml", "enc")]
    run(api, settings, cached(api))
    assert api.objects[("StatefulSet", "ml", "enc")]["spec"]["replicas"] == 2
    assert ("Service", "ml", "enc") in api.objects


def test_invalid_spec_is_reported_and_nothing_is_applied(
    pool_body: Callable[..., dict[str, Any]], settings: OperatorSettings
) -> None:
    api = FakeApi()
    api.add(pool_body({"model": "/m", "parallelism": {"tensor": 8, "data": 8}}, generation=3))
    outcome = run(api, settings)
    assert outcome.failed and "must not exceed spec.maxGPUsPerPod" in outcome.failed
    assert [w[0] for w in api.writes] == ["status"]
    pool_status = api.objects[("EncoderPool", "ml", "enc")]["status"]
    assert pool_status["reason"] == "InvalidSpec" and pool_status["observedGeneration"] == 3
    assert api.events == [Event("Warning", "InvalidSpec", outcome.failed)]


def test_a_child_the_api_server_refuses_is_apply_failed(api: FakeApi, settings: OperatorSettings) -> None:
    api.reject.add("StatefulSet")
    outcome = run(api, settings)
    assert outcome.failed and outcome.status["reason"] == "ApplyFailed"
    assert "StatefulSet is invalid" in outcome.status["message"]


def test_a_hand_edited_service_that_cannot_be_applied_over_is_recreated(
    api: FakeApi, settings: OperatorSettings
) -> None:
    """A Service port edited in place: the apply is refused (our port would be a second entry named
    "http") until the operator deletes its own Service and applies a fresh one."""
    run(api, settings)
    old_uid = api.objects[("Service", "ml", "enc")]["metadata"]["uid"]
    api.objects[("Service", "ml", "enc")]["spec"]["ports"][0]["port"] = 8080  # the hand edit
    api.reject.add("Service")
    delete = api.delete

    def delete_then_accept(kind: str, namespace: str, name: str, uid: str) -> None:
        delete(kind, namespace, name, uid)
        api.reject.discard(kind)  # the edited object is gone: a fresh one applies cleanly

    api.delete = delete_then_accept  # type: ignore[method-assign]
    outcome = run(api, settings)
    assert not outcome.failed
    assert ("delete", "Service", "enc") in api.writes
    assert api.objects[("Service", "ml", "enc")]["metadata"]["uid"] != old_uid


def test_a_service_refused_even_when_fresh_is_apply_failed(api: FakeApi, settings: OperatorSettings) -> None:
    run(api, settings)
    api.objects[("Service", "ml", "enc")]["spec"]["ports"][0]["port"] = 8080
    api.reject.add("Service")
    outcome = run(api, settings)
    assert outcome.failed and outcome.status["reason"] == "ApplyFailed"


def test_a_refused_statefulset_is_never_deleted_to_force_the_apply(api: FakeApi, settings: OperatorSettings) -> None:
    run(api, settings)
    api.objects[("StatefulSet", "ml", "enc")]["spec"]["replicas"] = 7
    api.reject.add("StatefulSet")
    outcome = run(api, settings)
    assert outcome.failed and ("StatefulSet", "ml", "enc") in api.objects
    assert ("delete", "StatefulSet", "enc") not in api.writes


def test_a_child_held_by_another_owner_is_a_conflict(api: FakeApi, settings: OperatorSettings) -> None:
    """The children of a deleted pool of the same name: wait for garbage collection, not InvalidSpec."""
    api.reject.add("Service")
    api.add({"kind": "Service", "metadata": {"name": "enc", "namespace": "ml", "uid": "s",
                                             "ownerReferences": [{"controller": True, "uid": "old-pool"}]}})
    with pytest.raises(errors.ConflictError, match="controlled by another owner"):
        run(api, settings)


def test_a_missing_or_deleting_pool_is_left_to_garbage_collection(
    pool_body: Callable[..., dict[str, Any]], settings: OperatorSettings
) -> None:
    api = FakeApi()
    assert run(api, settings).found is False
    deleting = pool_body({"model": "/m"})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.add(deleting)
    assert run(api, settings).found is False and api.writes == []


def test_status_always_describes_the_latest_generation(api: FakeApi, settings: OperatorSettings,
                                                       pod: Callable[..., dict[str, Any]]) -> None:
    run(api, settings)
    api.controller_observes(2, pod)
    run(api, settings)
    pool = api.objects[("EncoderPool", "ml", "enc")]
    pool["metadata"]["generation"] = 2
    pool["spec"]["batching"] = {"maxBatchSize": 4}
    outcome = run(api, settings)
    assert outcome.status["observedGeneration"] == 2
    assert outcome.waiting, "the new template is not observed by the StatefulSet controller yet"
