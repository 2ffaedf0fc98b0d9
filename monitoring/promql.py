"""The dashboard's queries as Prometheus runs them: read from the dashboard JSON, variables filled in."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRIC = re.compile(r"\b(encoder(?:pool_operator)?_[a-z0-9_]+)\b")
"""A series name of the pods (``encoder_*``) or of the operator (``encoderpool_operator_*``)."""


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel of the dashboard JSON."""

    panel: str
    expr: str
    legend: str
    kind: str


def panel_queries(dashboard: dict[str, Any] | Path) -> list[PanelQuery]:
    """Every target of every panel (rows excluded), in the dashboard's order."""
    model = json.loads(dashboard.read_text()) if isinstance(dashboard, Path) else dashboard
    out = []
    for panel in model["panels"]:
        for target in panel.get("targets") or []:
            out.append(PanelQuery(panel["title"], target["expr"], target.get("legendFormat", ""), panel["type"]))
    return out


def instantiate(expr: str, pool: str = ".+", pod: str = ".+", rate_interval: str = "5m", time_range: str = "15m") -> str:
    """``expr`` with Grafana's variables replaced as Grafana would for these choices."""
    return (
        expr.replace("$__rate_interval", rate_interval).replace("$__range", time_range)
        .replace("$pool", pool).replace("$pod", pod)
    )


def metric_names(expr: str) -> set[str]:
    """The encoder and operator series an expression reads."""
    return set(METRIC.findall(expr))
