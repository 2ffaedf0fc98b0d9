"""The Helm chart: its CRD copy, its values contract, and what it renders.

The rendering tests run the real helm (built from its Go module by hack/build-control-plane.sh
and cached outside the repo; found by tests/support/helm.py) and are integration tests. They
skip, saying why, when helm has not been built yet.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from encoderpool_operator import rbac
from encoderpool_operator.settings import ENV_PREFIX, OperatorSettings
from tests.support.helm import CHART, MISSING, helm_path, render, run_helm


@pytest.fixture(scope="module")
def helm() -> str:
    """Path of the helm binary, or skip."""
    path = helm_path()
    if path is None:
        pytest.skip(MISSING)
    return path


def listed(objs: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Every rendered object of one kind."""
    found = objs.get(kind, [])
    return found if isinstance(found, list) else [found]


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def expected_rules(table: tuple[rbac.Rule, ...] = rbac.RULES) -> set[tuple[str, str, str]]:
    return {(r.group, r.resource, v) for r in table for v in r.verbs}


@pytest.mark.unit
def test_chart_crd_is_byte_identical_to_the_top_level_crd() -> None:
    name = "encoderpools.encoderpool.io.yaml"
    assert (CHART / "crds" / name).read_bytes() == (CHART.parents[1] / "crds" / name).read_bytes(), (
        "copy crds/ into charts/encoderpool-operator/crds/"
    )


@pytest.mark.unit
def test_default_values_satisfy_the_schema_which_refuses_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({**values, "resyncSecond": 5})

    def closed(node: dict[str, Any], path: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
            for key, child in node["properties"].items():
                closed(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            closed(node["items"], f"{path}[]")

    closed(schema, "values")
    for name, definition in schema.get("definitions", {}).items():
        closed(definition, name)


@pytest.mark.unit
def test_every_value_is_documented_with_an_example_or_a_choice() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    for key in values:
        block = re.search(rf"((?:^ *#.*\n)+)^{re.escape(key)}:", text, re.M)
        nested = re.search(rf"^{re.escape(key)}:\n((?: +.*\n)+)", text, re.M)
        documented = block or (nested and "# --" in nested.group(1))
        assert documented, f"values.yaml: {key} has no comment"


@pytest.mark.integration
def test_helm_lint_strict(helm: str) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.integration
def test_default_render(helm: str) -> None:
    objs = render(helm)
    assert set(objs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"}
    deploy = objs["Deployment"]
    # Two replicas with leader election: one works, one stands by; a rolling update is safe.
    assert deploy["spec"]["replicas"] == 2 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == objs["ServiceAccount"]["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["image"] == "encoderpool/encoderpool-operator:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = {e["name"]: e.get("value") for e in container["env"] if "value" in e}
    for name in env:
        assert name.removeprefix(ENV_PREFIX).lower() in OperatorSettings.model_fields, name
    assert env["ENCODERPOOL_OPERATOR_NAMESPACES"] == ""
    settings = OperatorSettings(**{k.removeprefix(ENV_PREFIX).lower(): v for k, v in env.items() if v})
    assert settings.clusterwide and settings.liveness_port == container["ports"][0]["containerPort"]
    assert settings.leader_election and settings.lease_name == deploy["metadata"]["name"]
    downward = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
    assert downward == {"POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    assert rules_of(objs["ClusterRole"]) == expected_rules()
    subject = objs["ClusterRoleBinding"]["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (objs["ServiceAccount"]["metadata"]["name"], "ops")
    # The Lease: a Role in the release namespace only.
    assert objs["Role"]["metadata"]["namespace"] == "ops"
    assert rules_of(objs["Role"]) == expected_rules(rbac.LEASE_RULES)
    affinity = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert affinity["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


@pytest.mark.integration
def test_non_default_render(helm: str) -> None:
    objs = render(
        helm,
        "watchNamespaces={ml,cv}",
        "image.repository=registry.example.com/op",
        "image.tag=1.2.3",
        "serviceAccount.create=false",
        "serviceAccount.name=shared",
        "resyncSeconds=30",
        "nodeSelector.kubernetes\\.io/os=linux",
        "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
        strings=("extraEnv[0].name=ENCODERPOOL_OPERATOR_WAIT_SECONDS", "extraEnv[0].value=10"),
    )
    assert "ServiceAccount" not in objs
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ENCODERPOOL_OPERATOR_NAMESPACES"] == "ml,cv" and env["ENCODERPOOL_OPERATOR_WAIT_SECONDS"] == "10"
    assert env["ENCODERPOOL_OPERATOR_RESYNC_SECONDS"] == "30"
    assert container["image"] == "registry.example.com/op:1.2.3"
    assert pod["serviceAccountName"] == "shared" and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    # A namespaced install: Roles in the watched namespaces, nothing cluster-wide.
    assert "ClusterRole" not in objs and "ClusterRoleBinding" not in objs
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in listed(objs, "Role")}
    assert set(roles) == {("ml", "encpool-encoderpool-operator"), ("cv", "encpool-encoderpool-operator"),
                          ("ops", "encpool-encoderpool-operator-leader-election")}
    for namespace in ("ml", "cv"):
        assert rules_of(roles[(namespace, "encpool-encoderpool-operator")]) == expected_rules()
    bindings = {b["metadata"]["namespace"]: b for b in listed(objs, "RoleBinding")}
    assert set(bindings) == {"ml", "cv", "ops"}
    assert all(b["subjects"][0] == {"kind": "ServiceAccount", "name": "shared", "namespace": "ops"}
               for b in bindings.values())


@pytest.mark.integration
def test_rbac_can_be_left_to_someone_else(helm: str) -> None:
    objs = render(helm, "rbac.create=false")
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & set(objs)


@pytest.mark.integration
def test_monitoring_objects_are_optional(helm: str) -> None:
    objs = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.encoderPodMonitor.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom")
    monitor = objs["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    (service,) = [s for s in listed(objs, "Service")]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    encoders = objs["PodMonitor"]
    assert encoders["spec"]["namespaceSelector"] == {"any": True}
    assert encoders["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "encoderpool-operator"
    assert encoders["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    scoped = render(helm, "metrics.encoderPodMonitor.enabled=true", "watchNamespaces={ml}")
    assert scoped["PodMonitor"]["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    assert "ServiceMonitor" not in render(helm)


@pytest.mark.integration
@pytest.mark.parametrize("value", ["bogus=1", "image.tagg=1", "logLevel=verbose", "resyncSeconds=1", "livenessPort=80"])
def test_an_unknown_or_bad_value_fails(helm: str, value: str) -> None:
    done = run_helm(helm, "template", "encpool", str(CHART), "--set", value)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr or "schema" in done.stderr


@pytest.mark.integration
def test_long_release_names_are_cut_to_63(helm: str) -> None:
    objs = render(helm, release="r" * 53)
    for obj in objs.values():
        assert len(obj["metadata"]["name"]) <= 63 and not obj["metadata"]["name"].endswith("-")
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63


@pytest.mark.integration
def test_dashboard_configmap_carries_the_committed_dashboard_for_the_sidecar(helm: str) -> None:
    assert "ConfigMap" not in render(helm)
    objs = render(helm, "metrics.dashboard.enabled=true", "metrics.dashboard.annotations.grafana_folder=Encoders")
    config = objs["ConfigMap"]
    assert config["metadata"]["namespace"] == "ops"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "Encoders"}
    committed = json.loads((CHART / "dashboards" / "encoderpool.json").read_text())
    assert json.loads(config["data"]["encoderpool.json"]) == committed
    moved = render(helm, "metrics.dashboard.enabled=true", "metrics.dashboard.namespace=monitoring",
                   "metrics.dashboard.labels.grafana_dashboard=null", "metrics.dashboard.labels.team=ml")["ConfigMap"]
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["team"] == "ml" and "grafana_dashboard" not in moved["metadata"]["labels"]


@pytest.mark.integration
def test_prometheus_rule_thresholds_and_labels_come_from_values(helm: str) -> None:
    assert "PrometheusRule" not in render(helm)
    rule = render(helm, "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom",
                  "metrics.prometheusRule.alertLabels.team=ml",
                  "metrics.prometheusRule.latencyHigh.p99Seconds=2.5", "metrics.prometheusRule.latencyHigh.for=15m",
                  "metrics.prometheusRule.workerCrashLoop.restarts=7", "metrics.prometheusRule.rateWindow=10m",
                  "metrics.prometheusRule.runbookBaseURL=https://docs.example.com/observability.md/")["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"EncoderPoolReplicasNotReady", "EncoderPoolQueueSaturated", "EncoderWorkerCrashLooping",
                           "EncoderDeliveryFailing", "EncoderLatencyHigh", "EncoderPoolOperatorFailure"}
    latency = alerts["EncoderLatencyHigh"]
    assert latency["expr"].rstrip().endswith("> 2.5") and "[10m]" in latency["expr"] and latency["for"] == "15m"
    assert alerts["EncoderWorkerCrashLooping"]["expr"].rstrip().endswith(">= 7")
    for name, alert in alerts.items():
        assert alert["labels"]["team"] == "ml" and alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["runbook_url"] == f"https://docs.example.com/observability.md#{name.lower()}"


@pytest.mark.integration
def test_encoder_pod_monitor_labels_series_with_the_pool(helm: str) -> None:
    monitor = render(helm, "metrics.encoderPodMonitor.enabled=true")["PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_encoderpool_io_pool"],
                                        "targetLabel": "pool"}]


@pytest.mark.integration
@pytest.mark.parametrize("value", ["metrics.dashboard.enabeld=true", "metrics.prometheusRule.latencyHigh.p99Second=1",
                                   "metrics.prometheusRule.queueSaturation.ratio=5", "metrics.prometheusRule.deliveryFailing.ratio=1.5",
                                   "metrics.prometheusRule.latencyHigh.p99Seconds=0",
                                   "metrics.prometheusRule.replicasNotReady.for=ten",
                                   "metrics.prometheusRule.workerCrashLoop.restarts=0"])
def test_a_bad_observability_value_fails(helm: str, value: str) -> None:
    done = run_helm(helm, "template", "encpool", str(CHART), "--set", value)
    assert done.returncode != 0 and "schema" in done.stderr, done.stderr
