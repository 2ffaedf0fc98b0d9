"""Pictures of the dashboard: every panel's queries run on a Prometheus, drawn where Grafana would.

Grafana cannot be installed here, so the committed pictures in ``docs/`` are drawn with
matplotlib (the plotting the benchmarks use) from Prometheus's query API: the panels, their
queries, legends, units and grid positions are read from the generated dashboard JSON
(:data:`monitoring.dashboard.OUTPUT`), Grafana's variables filled in as Grafana would for "All"
pools and pods. Time series are range queries, the heatmap de-accumulates its ``le`` buckets as
Grafana's heatmap format does, and the table is an instant query at the end of the range.

``tests/integration/test_dashboard_prometheus.py`` draws them from its real load run (and writes
them into ``docs/`` when ``ENCODERPOOL_DASHBOARD_PICTURES=docs`` is set). For a Prometheus of
your own::

    .venv/bin/python -m monitoring.pictures --prometheus http://127.0.0.1:9090 --minutes 15 --out /tmp/pictures
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from monitoring.dashboard import OUTPUT
from monitoring.promql import instantiate

PICTURES: dict[str, tuple[str, ...]] = {
    "dashboard-pods.png": ("Throughput", "Latency", "Batching and admission", "Errors", "Cache"),
    "dashboard-workers.png": ("Workers", "Delivery", "Operator"),
}
"""Each picture and the dashboard rows it shows, top to bottom."""

RangeQuery = Callable[[str, float, float, float], list[dict[str, Any]]]
"""``(expr, start, end, step)`` -> Prometheus's matrix result."""
InstantQuery = Callable[[str, float], list[dict[str, Any]]]
"""``(expr, at)`` -> Prometheus's vector result."""

BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
UNIT_SUFFIX = {"s": "s", "ops": "/s", "reqps": "req/s", "percentunit": "", "bytes": "B", "short": ""}


@dataclass(frozen=True)
class Drawn:
    """One panel as drawn: its title and how many series (or table rows) it showed."""

    title: str
    series: int


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend template filled in."""
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out if out else json.dumps(labels)


def _rows(model: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    current = ""
    for panel in model["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = [panel]
        else:
            rows.setdefault(current, []).append(panel)
    return rows


def _format_value(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "bytes":
        for suffix, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "s" and 0 < abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.3g}{UNIT_SUFFIX.get(unit, '')}"


def _style(ax: Any, title: str) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left")
    ax.tick_params(colors=TEXT, labelsize=7)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(True, color=GRID, linewidth=0.5)


def _timeseries(ax: Any, panel: dict[str, Any], query_range: RangeQuery, start: float, end: float, step: float,
                rate_interval: str, time_range: str) -> int:
    import matplotlib.ticker as ticker

    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    drawn = 0
    for target in panel["targets"]:
        expr = instantiate(target["expr"], rate_interval=rate_interval, time_range=time_range)
        for series in query_range(expr, start, end, step):
            points = [(float(t) - end, float(v)) for t, v in series["values"] if math.isfinite(float(v))]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, linewidth=1.2, label=legend(target.get("legendFormat", ""), series["metric"]))
            drawn += 1
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _format_value(v, unit)))
    ax.set_xlim(start - end, 0)
    ax.set_xlabel("seconds before the end of the run", color=TEXT, fontsize=7)
    if drawn:
        ax.legend(fontsize=6, loc="upper left", facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT, ncol=2)
    else:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
    return drawn


def _heatmap(ax: Any, panel: dict[str, Any], query_range: RangeQuery, start: float, end: float, step: float,
             rate_interval: str, time_range: str) -> int:
    import numpy as np

    target = panel["targets"][0]
    result = query_range(instantiate(target["expr"], rate_interval=rate_interval, time_range=time_range), start, end, step)
    buckets = sorted(result, key=lambda s: float(s["metric"]["le"]))
    if not buckets:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
        return 0
    times = sorted({float(t) for s in buckets for t, _ in s["values"]})
    index = {t: i for i, t in enumerate(times)}
    cumulative = np.zeros((len(buckets), len(times)))
    for row, series in enumerate(buckets):
        for t, v in series["values"]:
            cumulative[row, index[float(t)]] = float(v) if math.isfinite(float(v)) else 0.0
    counts = np.diff(cumulative, axis=0, prepend=0.0).clip(min=0)  # Grafana's heatmap format: per bucket
    labels = [s["metric"]["le"] for s in buckets]
    ax.imshow(counts, aspect="auto", origin="lower", cmap="inferno", interpolation="nearest",
              extent=(times[0] - end, times[-1] - end, -0.5, len(labels) - 0.5))
    ax.set_yticks(range(len(labels)), [f"≤{lab}" for lab in labels])
    ax.set_xlabel("seconds before the end of the run", color=TEXT, fontsize=7)
    ax.grid(False)
    return len(buckets)


def _table(ax: Any, panel: dict[str, Any], query: InstantQuery, end: float, rate_interval: str, time_range: str) -> int:
    target = panel["targets"][0]
    result = query(instantiate(target["expr"], rate_interval=rate_interval, time_range=time_range), end)
    labels = sorted({k for s in result for k in s["metric"]})
    rows = [[s["metric"].get(k, "") for k in labels] + [f"{float(s['value'][1]):.0f}"]
            for s in sorted(result, key=lambda s: -float(s["value"][1]))]
    ax.axis("off")
    if not rows:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
        return 0
    table = ax.table(cellText=rows[:12], colLabels=labels + ["Value"], loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for cell in table.get_celld().values():
        cell.set_facecolor(PANEL)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)
    return len(rows)


def draw(path: Path, rows: tuple[str, ...], query_range: RangeQuery, query: InstantQuery, start: float, end: float,
         step: float, rate_interval: str, time_range: str, dashboard: Path = OUTPUT) -> list[Drawn]:
    """Draw the dashboard ``rows`` over ``[start, end]`` into ``path``; what each panel showed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = json.loads(dashboard.read_text())
    by_row = _rows(model)
    # Rows are stacked as on the dashboard, with the vertical gaps of rows left out.
    y, placed = 0, []
    for title in rows:
        first = min(p["gridPos"]["y"] for p in by_row[title])
        for panel in by_row[title]:
            placed.append((panel, y + panel["gridPos"]["y"] - first))
        y += max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in by_row[title]) - first
    height_units = y
    unit_px = 30
    fig = plt.figure(figsize=(24 * 0.75, height_units * unit_px / 100), dpi=100, facecolor=BACKGROUND)
    out: list[Drawn] = []
    for panel, py in placed:
        pos = panel["gridPos"]
        if panel["type"] == "row":
            fig.text(0.005, 1 - (py + 0.7) / height_units, panel["title"], color=TEXT, fontsize=11, weight="bold")
            continue
        margin_x, margin_top, margin_bottom = 0.035, 0.9, 1.4
        rect = (pos["x"] / 24 + margin_x, 1 - (py + pos["h"] - margin_bottom * 0.5) / height_units,
                pos["w"] / 24 - 1.5 * margin_x, (pos["h"] - margin_top - margin_bottom * 0.5) / height_units)
        ax = fig.add_axes(rect)
        _style(ax, panel["title"])
        if panel["type"] == "heatmap":
            count = _heatmap(ax, panel, query_range, start, end, step, rate_interval, time_range)
        elif panel["type"] == "table":
            count = _table(ax, panel, query, end, rate_interval, time_range)
        else:
            count = _timeseries(ax, panel, query_range, start, end, step, rate_interval, time_range)
        out.append(Drawn(panel["title"], count))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor=BACKGROUND)
    plt.close(fig)
    return out


def draw_all(out_dir: Path, query_range: RangeQuery, query: InstantQuery, start: float, end: float, step: float,
             rate_interval: str, time_range: str) -> dict[str, list[Drawn]]:
    """Every picture of :data:`PICTURES` into ``out_dir``."""
    return {name: draw(out_dir / name, rows, query_range, query, start, end, step, rate_interval, time_range)
            for name, rows in PICTURES.items()}


def _api(base_url: str) -> tuple[RangeQuery, InstantQuery]:
    def call(path: str, **params: Any) -> list[dict[str, Any]]:
        body = httpx.get(f"{base_url}/api/v1/{path}", params=params, timeout=60).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{params.get('query')}: {body.get('error')}")
        return list(body["data"]["result"])

    def query_range(expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return call("query_range", query=expr, start=start, end=end, step=step)

    def query(expr: str, at: float) -> list[dict[str, Any]]:
        return call("query", query=expr, time=at)

    return query_range, query


def main(argv: list[str] | None = None) -> int:
    """Draw the pictures from a running Prometheus."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15.0, help="the time range, ending now")
    parser.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for")
    parser.add_argument("--out", type=Path, required=True, help="directory for the PNG files")
    args = parser.parse_args(argv)
    end = time.time()
    start = end - args.minutes * 60
    query_range, query = _api(args.prometheus.rstrip("/"))
    drawn = draw_all(args.out, query_range, query, start, end, max(1.0, (end - start) / 300),
                     args.rate_interval, f"{int(end - start)}s")
    for name, panels in drawn.items():
        empty = [p.title for p in panels if not p.series]
        print(f"wrote {args.out / name}: {len(panels)} panels" + (f", no data in {empty}" if empty else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
