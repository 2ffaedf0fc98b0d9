"""The chart's alert rules under promtool: valid, and each fires on the history made to trigger it.

The rules are rendered by the real helm (the PrometheusRule at the chart's default values) and
written as a Prometheus rule file next to tests/integration/data/alert-rules.promtool.yaml, whose
cases are run by ``promtool test rules``: each alert pending, then firing with its labels and
annotations on a series history made to trigger it, and silent on a healthy one. The dashboard's
queries are checked as PromQL by the same promtool. Debian's prometheus package carries promtool
(``bash hack/prometheus.sh`` installs it; ``make test`` runs that).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring import dashboard
from monitoring.promql import instantiate, panel_queries
from tests.support.helm import MISSING, helm_path, rendered_rules
from tests.support.prometheus import INSTALL_HINT, binary

pytestmark = pytest.mark.integration

CASES = Path(__file__).with_name("data") / "alert-rules.promtool.yaml"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


@pytest.fixture(scope="module")
def helm() -> str:
    path = helm_path()
    if path is None:
        pytest.skip(MISSING)
    return path


@pytest.fixture(scope="module")
def promtool() -> str:
    path = binary("promtool")
    if path is None:
        pytest.skip(INSTALL_HINT)
    return path


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_rules_are_valid_and_pass_their_unit_tests(helm: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(helm), sort_keys=False))
    shutil.copy(CASES, tmp_path / CASES.name)
    checked = _promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout, checked.stdout
    tested = _promtool(promtool, "test", "rules", CASES.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_a_rule_test_that_expects_the_wrong_alert_fails(helm: str, promtool: str, tmp_path: Path) -> None:
    # The harness itself can fail: a firing case whose expected value is off is reported as such.
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(helm), sort_keys=False))
    (tmp_path / "cases.yaml").write_text(CASES.read_text().replace("wants 2 pods", "wants 3 pods"))
    tested = _promtool(promtool, "test", "rules", "cases.yaml", cwd=tmp_path)
    assert tested.returncode != 0 and "EncoderPoolReplicasNotReady" in tested.stdout + tested.stderr


def test_every_alert_is_tested_and_has_a_runbook_section(helm: str) -> None:
    alerts = [r for group in rendered_rules(helm)["groups"] for r in group["rules"]]
    cases = yaml.safe_load(CASES.read_text())["tests"]
    tested = {c["alertname"] for t in cases for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases[-1]["alert_rule_test"]}
    anchors = {re.sub(r"[^a-z0-9-]", "", line[4:].strip().lower()) for line in DOCS.read_text().splitlines()
               if line.startswith("### ")}
    for alert in alerts:
        assert alert["alert"] in tested and alert["alert"] in quiet, alert["alert"]
        anchor = alert["annotations"]["runbook"].split("#", 1)[1]
        assert alert["annotations"]["runbook"].startswith("docs/observability.md#") and anchor in anchors, anchor


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    # promtool parses recording rules' expressions offline: every panel query, variables filled in.
    rules = [{"record": f"panel:query_{i}", "expr": instantiate(q.expr)} for i, q in enumerate(panel_queries(dashboard.OUTPUT))]
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    checked = _promtool(promtool, "check", "rules", "panels.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
