"""The dashboard and the alert rules on a real Prometheus scraping real pods and a real operator.

What runs, all on loopback:

- Prometheus (Debian's 2.42) scraping every second, with the chart's alert rules rendered by the
  real helm and evaluated every second;
- two real ``encoder-pod serve`` processes on tiny checkpoints: ``vision-0`` (Qwen2.5-Omni:
  images and audio, the embedding cache on, a small ``MAX_QUEUE``) and ``parallel-0`` (CLIP
  with ``--dp-size 2 --tp-size 2``: two data-parallel groups of two tensor-parallel ranks). Their
  scrape targets carry the ``pool``, ``namespace`` and ``pod`` labels the chart's encoder
  PodMonitor sets by relabelling (static labels here: no kubelet runs these pods);
- the operator as a host process (``encoderpool-operator``) on the local control plane
  (testkit.cluster: etcd, kube-apiserver, controller-manager, scheduler, kwok nodes), scraped the
  way the chart's ServiceMonitor does, reconciling five pools.

Every failure a panel or an alert needs is caused for real, cheaply: pushes to a prefill port
nobody listens on (502, delivery failures), a client that hangs up (499), requests held by a
slow media origin until ``ENCODER_REQ_TIMEOUT`` (504, high p99) while more are refused (429),
SIGKILL of a tensor-parallel follower and of a data-parallel worker under load (503, worker
deaths, restarts, a TP group restart), a ValidatingAdmissionPolicy refusing one pool's
StatefulSet as invalid (ApplyFailed) and another's Service as forbidden (reconcile errors), and
a pool no node can hold (not ready, ProgressDeadlineExceeded after 30 s).

Windows: the dashboard's queries use ``$__rate_interval`` and ``$__range``, which Grafana fills
from its scrape interval and time range. Here each query is evaluated once at the end with both
set to the length of the run (as a Grafana time range of exactly the run would, at one step),
so a failure caused early still counts; the metric names are checked exactly against what the
processes export. The rules are the chart's at its default thresholds, except what a 4-minute
test cannot wait for, set through the chart's own values: every ``for`` is 0s, ``rateWindow`` is
30s, and a crash loop is 1 restart (not 3) within 5m. Each alert must have fired
(Prometheus's ``ALERTS`` series) on the pool whose failure was caused.

``ENCODERPOOL_DASHBOARD_PICTURES=docs`` also writes the dashboard pictures of this run into docs/
(monitoring/pictures.py draws them; they are always drawn into the test's temporary directory).
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from monitoring import dashboard, pictures
from monitoring.promql import PanelQuery, instantiate, metric_names, panel_queries
from tests.integration.encode_client import encode
from tests.support.helm import MISSING, helm_path, rendered_rules
from tests.support.media_files import audio_bytes, data_uri, tone
from tests.support.media_host import MediaHost
from tests.support.prometheus import INSTALL_HINT, Prometheus, binary
from testkit.cluster import Cluster, MissingBinaries, load_binaries
from testkit.cluster.api import ApiError, path_for, wait_for
from testkit.cluster.objects import crd_established
from testkit.load import ClosedLoop
from testkit.media import png_data_uri
from testkit.server import EncoderServer, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "encoderpools.encoderpool.io.yaml"
POD_NAMESPACE = "ml"
"""The namespace label of the encoder pods' targets."""
REQ_TIMEOUT_S = 6.0
"""vision-0's ENCODER_REQ_TIMEOUT: above the EncoderLatencyHigh default (5 s), so a held request is a slow one."""
MAX_QUEUE = 4
RULE_VALUES = (
    "metrics.prometheusRule.rateWindow=30s",
    "metrics.prometheusRule.replicasNotReady.for=0s",
    "metrics.prometheusRule.queueSaturation.for=0s",
    "metrics.prometheusRule.workerCrashLoop.restarts=1",
    "metrics.prometheusRule.workerCrashLoop.window=5m",
    "metrics.prometheusRule.deliveryFailing.for=0s",
    "metrics.prometheusRule.latencyHigh.for=0s",
    "metrics.prometheusRule.operatorFailure.for=0s",
)
EXPECTED_ALERTS = {
    "EncoderPoolQueueSaturated": {"pool": "vision"},
    "EncoderDeliveryFailing": {"pool": "vision", "backend": "zmq_to_tokenizer"},
    "EncoderLatencyHigh": {"pool": "vision"},
    "EncoderWorkerCrashLooping": {"pool": "parallel", "pod": "parallel-0"},
    "EncoderPoolReplicasNotReady": {"pool": "stalled"},
    "EncoderPoolOperatorFailure": {"pool": "refused", "reason": "ApplyFailed"},
}
"""Each alert and labels it must have fired with (a second OperatorFailure, on ``stalled``, is checked below)."""
MUST_SHOW = {
    "Items per second by modality": [{"modality": "IMAGE"}, {"modality": "AUDIO"}],
    "Refusals and errors per second by code": [{"code": c} for c in ("429", "499", "502", "503", "504")],
    "Errors by code and kind": [{"kind": k} for k in ("overloaded", "client_gone", "transfer_failed", "worker_died", "timeout")],
    "DP worker deaths by reason": [{"reason": "killed", "rank": "0"}],
    "DP worker restarts": [{"rank": "0"}, {"rank": "1"}],
    "TP group restarts": [{"rank": "1"}],
    "Delivery failures by backend": [{"backend": "zmq_to_tokenizer"}],
    "Delivery p99 by backend": [{"backend": "inline"}, {"backend": "zmq_to_tokenizer"}],
    "Reconciles per second by result": [{"result": r} for r in ("ok", "failed", "error")],
    "Reconcile errors by type": [{"error": "ForbiddenError"}],
    "Pools by status reason": [{"reason": "Ready"}, {"reason": "ApplyFailed"}],
    "Pool replicas: ready and desired": [{"pool": "vision", "state": "ready"}, {"pool": "stalled", "state": "desired"}],
}
"""Panels whose data must include a positive value for each of these label sets: the failures caused."""


# --- the operator's side: a local control plane, the operator process, five pools -----------------

def _pool(name: str, replicas: int = 1, cpu: str = "100m", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "metadata": {"name": name},
            "spec": {"model": "/opt/encoderpool/models/qwen2_vl-tiny", "device": "cpu", "replicas": replicas,
                     "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}, **spec}}


POOLS = [
    _pool("vision"),
    _pool("parallel", replicas=2),
    _pool("refused"),  # its StatefulSet is refused as invalid: ApplyFailed
    _pool("forbidden"),  # its Service is refused as forbidden: a ForbiddenError each reconcile
    _pool("stalled", cpu="4000", rollout={"progressDeadlineSeconds": 30}),  # no node has 4000 CPUs
]


def _refusal(name: str, resource: str, group: str, prefix: str, reason: str) -> list[tuple[str, dict[str, Any]]]:
    """A ValidatingAdmissionPolicy (and its binding) refusing ``resource`` objects named ``prefix*``."""
    api = "admissionregistration.k8s.io/v1"
    policy = {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["v1"],
                                                "operations": ["CREATE", "UPDATE"], "resources": [resource]}]},
        "validations": [{"expression": f"!object.metadata.name.startsWith('{prefix}')", "reason": reason,
                         "message": f"{resource} named {prefix}* are refused here (a test's admission policy)"}]}}
    binding = {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return [(path_for(api, "validatingadmissionpolicies"), policy),
            (path_for(api, "validatingadmissionpolicybindings"), binding)]


def _refused_now(api: Any, namespace: str) -> bool:
    """Both policies are in effect: a dry-run create of each refused kind is refused with its code."""
    probes = [(path_for("apps/v1", "statefulsets", namespace), {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "refused-probe"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                 "spec": {"containers": [{"name": "c", "image": "i"}]}}}}, 422),
              (path_for("v1", "services", namespace), {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "forbidden-probe"},
        "spec": {"ports": [{"port": 80}]}}, 403)]
    for path, body, code in probes:
        try:
            api.request("POST", path, body, params={"dryRun": "All"})
        except ApiError as err:
            if err.status_code != code:
                return False
            continue
        return False
    return True


class OperatorSide:
    """The local control plane, the operator process and the pools, started on a thread of their own."""

    def __init__(self, workdir: Path) -> None:
        self.cluster: Cluster | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.namespace = f"obs-{uuid.uuid4().hex[:6]}"
        self.log = workdir / "operator.log"
        self.error: BaseException | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator-side", daemon=True)

    def start(self) -> "OperatorSide":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.cluster = Cluster()
            self.cluster.start()
            cluster = self.cluster
            cluster.kubectl("apply", "--server-side", "-f", str(CRD))
            cluster.create_namespace(self.namespace)
            with cluster.api() as api:
                for path, body in (_refusal("obs-refuse-sts", "statefulsets", "apps", "refused", "Invalid")
                                   + _refusal("obs-forbid-svc", "services", "", "forbidden", "Forbidden")):
                    api.create(path, body)
                wait_for(lambda: crd_established(api.get_or_none(path_for(
                    "apiextensions.k8s.io/v1", "customresourcedefinitions", name="encoderpools.encoderpool.io"))),
                    60, "the CRD")
                wait_for(lambda: _refused_now(api, self.namespace), 60, "the admission policies to take effect")
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
                   "ENCODERPOOL_OPERATOR_LIVENESS_PORT": str(self.port),
                   "ENCODERPOOL_OPERATOR_RESYNC_SECONDS": "5", "ENCODERPOOL_OPERATOR_LEADER_ELECTION": "false",
                   "ENCODERPOOL_OPERATOR_WAIT_SECONDS": "1"}
            with self.log.open("wb") as log:  # the child keeps its own descriptor
                self.proc = subprocess.Popen([str(Path(sys.executable).parent / "encoderpool-operator")], env=env,
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            wait_for(self._healthy, 120, "the operator's /healthz")
            manifest = "\n---\n".join(yaml.safe_dump(p) for p in POOLS)
            cluster.kubectl("-n", self.namespace, "apply", "-f", "-", input=manifest, timeout=120)
        except BaseException as exc:  # reported by the test (this runs on a thread)
            self.error = exc
        finally:
            self.started.set()

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait(self, timeout: float) -> None:
        assert self.started.wait(timeout), "the control plane and the operator did not start in time"
        if self.error is not None:
            raise self.error

    def reasons(self) -> dict[str, str]:
        assert self.cluster is not None
        with self.cluster.api() as api:
            items = api.get(path_for("encoderpool.io/v1alpha1", "encoderpools", self.namespace))["items"]
        return {p["metadata"]["name"]: (p.get("status") or {}).get("reason", "") for p in items}

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        self._thread.join(300)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.cluster is not None:
            self.cluster.stop()


# --- checks ---------------------------------------------------------------------------------------

def _exported(*expositions: str) -> set[str]:
    """Sample names of Prometheus text expositions."""
    names = set()
    for text in expositions:
        for line in text.splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _positive(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The label sets of the samples with a finite value above 0."""
    out = []
    for sample in result:
        value = float(sample["value"][1])
        if math.isfinite(value) and value > 0:
            out.append(sample["metric"])
    return out


def _panel_gaps(prom: Prometheus, queries: list[PanelQuery], window: str) -> dict[str, str]:
    """Panel query -> what is missing ({} when every query has data and every failure shows)."""
    gaps: dict[str, str] = {}
    by_panel: dict[str, list[dict[str, str]]] = {}
    for q in queries:
        result = prom.query(instantiate(q.expr, rate_interval=window, time_range=window))
        positive = _positive(result)
        # A rate or a quantile must have seen something happen; a gauge may well be 0 (an empty queue).
        counted = any(f in q.expr for f in ("rate(", "increase(", "histogram_quantile("))
        if not (positive if counted else result):
            gaps[f"{q.panel}: {q.expr}"] = f"no data ({len(result)} series, none above 0)" if result else "no data"
        by_panel.setdefault(q.panel, []).extend(positive)
    for panel, wanted in MUST_SHOW.items():
        for labels in wanted:
            if not any(all(m.get(k) == v for k, v in labels.items()) for m in by_panel.get(panel, [])):
                gaps[f"{panel} {labels}"] = f"not shown; shown: {by_panel.get(panel)}"
    return gaps


def _fired(prom: Prometheus, window: str) -> list[dict[str, str]]:
    return [s["metric"] for s in prom.query(f'max_over_time(ALERTS{{alertstate="firing"}}[{window}])')]


def _alert_gaps(fired: list[dict[str, str]]) -> list[str]:
    wanted = dict(EXPECTED_ALERTS)
    missing = [f"{name} {labels}" for name, labels in wanted.items()
               if not any(f["alertname"] == name and all(f.get(k) == v for k, v in labels.items()) for f in fired)]
    if not any(f["alertname"] == "EncoderPoolOperatorFailure" and f.get("reason") == "ProgressDeadlineExceeded"
               and f.get("pool") == "stalled" for f in fired):
        missing.append("EncoderPoolOperatorFailure on stalled (ProgressDeadlineExceeded)")
    return missing


def _wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if not last:
            return last
        time.sleep(2)
    raise AssertionError(f"{what} after {timeout:.0f}s: {last}")


# --- the test -----------------------------------------------------------------------------------

def _info(server: EncoderServer) -> dict[str, Any]:
    return httpx.get(server.base_url + "/server_info", timeout=10).json()


def _vision_body(images: list[str], sounds: list[str]) -> Callable[[int], dict[str, Any]]:
    def body(n: int) -> dict[str, Any]:
        if n % 3 == 2:
            return {"req_id": f"v-{n}", "modality": "AUDIO", "mm_items": [sounds[n % len(sounds)]]}
        return {"req_id": f"v-{n}", "modality": "IMAGE", "mm_items": [images[n % len(images)]]}
    return body


@pytest.mark.timeout(600)
def test_every_panel_and_alert_has_data_from_real_pods_and_the_operator(tiny_model, tmp_path: Path) -> None:
    helm = helm_path()
    if helm is None:
        pytest.skip(MISSING)
    if binary("prometheus") is None:
        pytest.skip(INSTALL_HINT)
    try:
        load_binaries()
    except MissingBinaries as err:
        pytest.skip(str(err))
    began = time.monotonic()
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{what} {time.monotonic() - began:.0f}s")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules(helm, *RULE_VALUES), sort_keys=False))
    operator = OperatorSide(tmp_path).start()
    host = MediaHost().__enter__()
    vision = EncoderServer(tiny_model("qwen2_5_omni"), env={
        "ENCODER_CACHE_SIZE_MB": "16", "ENCODER_MAX_QUEUE": str(MAX_QUEUE), "ENCODER_REQ_TIMEOUT": str(REQ_TIMEOUT_S),
        "ENCODER_MAX_BATCH_SIZE": str(MAX_QUEUE), "ENCODER_TRANSFER_BACKEND": "zmq_to_tokenizer",
        "ENCODER_SEND_TIMEOUT": "0.5", "ENCODER_MAX_WAIT_MS": "20", "ENCODER_NUM_THREADS": "1",
        "ENCODER_ALLOWED_MEDIA_DOMAINS": "127.0.0.1", "ENCODER_URL_FETCH_TIMEOUT": "60"})
    parallel = EncoderServer(tiny_model("clip"), env={"ENCODER_DP_RESTART_BACKOFF": "0.5", "ENCODER_NUM_THREADS": "1"},
                             args=["--dp-size", "2", "--tp-size", "2"])
    prom: Prometheus | None = None
    try:
        vision.start(wait_ready=False)
        parallel.start(wait_ready=False)
        targets = [
            {"job_name": "encoder-pods", "static_configs": [
                {"targets": [f"127.0.0.1:{vision.port}"], "labels": {"namespace": POD_NAMESPACE, "pool": "vision", "pod": "vision-0"}},
                {"targets": [f"127.0.0.1:{parallel.port}"], "labels": {"namespace": POD_NAMESPACE, "pool": "parallel", "pod": "parallel-0"}},
            ]},
            {"job_name": "encoderpool-operator", "static_configs": [
                {"targets": [f"127.0.0.1:{operator.port}"], "labels": {"namespace": "encoderpool-system", "pod": "operator"}}]},
        ]
        prom = Prometheus(targets, interval="1s", rule_files=[rules], workdir=tmp_path / "prometheus").start()
        vision.wait_status("/health", 200, 400)
        parallel.wait_status("/health", 200, 400)
        mark("pods ready")
        prom.wait_targets_up(2, 60)

        images = [png_data_uri(48, 48, seed=i) for i in range(4)]
        sounds = [data_uri(audio_bytes(tone(1.0, 16_000, seed), 16_000), "audio/wav") for seed in range(2)]
        vision_load = ClosedLoop(vision.base_url, 2, _vision_body(images, sounds), timeout=60).start()
        parallel_load = ClosedLoop(parallel.base_url, 3, lambda n: {
            "req_id": f"p-{n}", "modality": "IMAGE", "mm_items": [images[n % len(images)]]}, timeout=60).start()
        dead_port = free_port()
        with ThreadPoolExecutor(8) as pool:
            pushes = pool.submit(lambda: [encode(vision.base_url, f"push-{i}", [images[0]], prefill_host="127.0.0.1",
                                                 embedding_port=dead_port).status_code for i in range(6)])
            vision_load.wait_ok(12, 120)
            parallel_load.wait_ok(12, 120)
            # The workers' counters are exported at 0 from the start: once Prometheus has a sample of
            # them, a death counts in increase().
            wait_for(lambda: len(prom.query('encoder_dp_worker_restarts_total{pod="parallel-0"}')) == 2, 60,
                     "a scrape of the workers' restart counters")
            assert pushes.result() == [502] * 6
            # parallel-0: rank 1 loses a tensor-parallel follower, rank 0 its worker, both under load.
            workers = _info(parallel)["workers"]
            os.kill(workers[1]["model"]["tensor_parallel"]["follower_pids"][0], signal.SIGKILL)
            os.kill(workers[0]["pid"], signal.SIGKILL)
            wait_for(lambda: all(w["deaths"] >= 1 for w in _info(parallel)["workers"]), 60, "both groups down")
            mark("workers killed")
            parallel_answers = parallel_load.stop()
            vision_answers = vision_load.stop()
            # vision-0: one caller hangs up, then MAX_QUEUE requests wait on a held origin (504 after
            # REQ_TIMEOUT) while more are refused at once (429).
            with pytest.raises(httpx.ReadTimeout):
                encode(vision.base_url, "gone", [host.base_url + "/held/40x40.png"], timeout=0.5)
            wait_for(lambda: _info(vision)["inflight"] == 0, 30, "the gone caller's slot to be free")
            held = [pool.submit(encode, vision.base_url, f"held-{i}", [host.base_url + f"/held/4{i}x40.png"], timeout=60)
                    for i in range(MAX_QUEUE)]
            wait_for(lambda: _info(vision)["inflight"] >= MAX_QUEUE, 30, "the held requests in flight")
            refused = [encode(vision.base_url, f"over-{i}", [images[0]]).status_code for i in range(8)]
            assert [f.result().status_code for f in held] == [504] * MAX_QUEUE
            host.release()
            mark("vision refusals and timeouts")
        assert refused == [429] * 8, refused
        assert {a.status for a in parallel_answers} <= {200, 503}, {a.status for a in parallel_answers}
        assert 503 in {a.status for a in parallel_answers}, "no request was in flight on a killed worker"
        assert {a.status for a in vision_answers} == {200}, [a for a in vision_answers if a.status != 200][:3]

        operator.wait(300)
        mark("operator and pools applied")
        def window() -> str:
            """The run so far, as a PromQL range."""
            return f"{int(time.monotonic() - began) + 10}s"

        queries = panel_queries(dashboard.OUTPUT)
        # The operator's pools settle (stalled: 30 s without progress) while the last failures are scraped.
        gaps = _wait_until(lambda: _panel_gaps(prom, queries, window()), 150, "panels without data")
        mark("every panel has data")
        alert_gaps = _wait_until(lambda: _alert_gaps(_fired(prom, window())), 60, "alerts that never fired")
        mark("every alert fired")
        assert not gaps and not alert_gaps

        # The names the dashboard and the rules read are the names the processes export.
        expositions = [httpx.get(u + "/metrics", timeout=10).text for u in
                       (vision.base_url, parallel.base_url, f"http://127.0.0.1:{operator.port}")]
        exported = _exported(*expositions)
        read = {n for q in queries for n in metric_names(q.expr)}
        read |= {n for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"] for n in metric_names(r["expr"])}
        assert read <= exported, sorted(read - exported)
        loaded = [r for g in prom.rule_groups() for r in g["rules"]]
        assert len(loaded) == len(EXPECTED_ALERTS) and all(r["health"] == "ok" for r in loaded), loaded

        # The pictures, with the command docs/observability.md shows (into docs/ when asked).
        out = REPO / os.environ["ENCODERPOOL_DASHBOARD_PICTURES"] if os.environ.get("ENCODERPOOL_DASHBOARD_PICTURES") \
            else tmp_path / "pictures"
        drawn = subprocess.run([sys.executable, "-m", "monitoring.pictures", "--prometheus", prom.base_url,
                                "--minutes", f"{(time.monotonic() - began) / 60:.2f}", "--rate-interval", "15s",
                                "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert drawn.returncode == 0, drawn.stdout + drawn.stderr
        assert drawn.stdout.count("wrote ") == len(pictures.PICTURES) and "no data" not in drawn.stdout, drawn.stdout
        assert all((out / name).stat().st_size > 10_000 for name in pictures.PICTURES)
        mark("pictures drawn")
        print(f"\n{'; '.join(timeline)}; fired: {sorted({(f['alertname'], f.get('pool', '')) for f in _fired(prom, window())})}; "
              f"pool reasons: {operator.reasons()}")
    except BaseException:
        print(f"\ntimeline: {'; '.join(timeline)}")
        print("--- operator log ---\n" + operator.log_tail())
        print("--- vision-0 log ---\n" + vision.log_text()[-3000:])
        print("--- parallel-0 log ---\n" + parallel.log_text()[-3000:])
        if prom is not None:
            print("--- prometheus log ---\n" + prom.log_text()[-2000:])
        raise
    finally:
        host.__exit__(None, None, None)
        for server in (vision, parallel):
            server.__exit__(None, None, None)
        if prom is not None:
            prom.stop()
        operator.stop()
