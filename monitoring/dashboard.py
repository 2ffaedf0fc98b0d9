"""The encoder-pool Grafana dashboard, built with grafana-foundation-sdk from :mod:`monitoring.panels`.

``python -m monitoring.dashboard`` writes it to :data:`OUTPUT` (the chart ships that file in a
ConfigMap for Grafana's dashboard sidecar; it imports as it is too); ``--check`` only says
whether the committed file is what this generator makes. A test runs the check.

Why grafana-foundation-sdk and not grafanalib: it is Grafana's own library, generated from the
dashboard schema of each Grafana release (the pinned version matches Grafana 10.1's), and
released with Grafana; grafanalib's last release was in January 2024.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from monitoring.panels import ROWS, Panel

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "charts" / "encoderpool-operator" / "dashboards" / "encoderpool.json"
UID = "encoderpool-pools"
TITLE = "Encoder pools"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
HEIGHT = 8


def _variables() -> list[Any]:
    source = dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    pool = (
        dashboard.QueryVariable("pool").label("Pool").datasource(DATASOURCE)
        .query("label_values(encoder_max_queue, pool)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".+")
    )
    pod = (
        dashboard.QueryVariable("pod").label("Pod").datasource(DATASOURCE)
        .query('label_values(encoder_max_queue{pool=~"$pool"}, pod)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".+")
    )
    return [source, pool, pod]


def _panel(spec: Panel, panel_id: int) -> Any:
    builder: Any
    if spec.kind == "heatmap":
        builder = heatmap.Panel()
    elif spec.kind == "table":
        builder = table.Panel()
    else:
        builder = timeseries.Panel().fill_opacity(10)
    builder = (
        builder.id(panel_id).title(spec.title).description(spec.description).unit(spec.unit)
        .datasource(DATASOURCE).span(spec.width).height(HEIGHT)
    )
    for index, query in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + index))
        target = target.datasource(DATASOURCE)
        if spec.kind == "heatmap":
            target = target.format(PromQueryFormat.HEATMAP)
        elif spec.kind == "table":
            target = target.format(PromQueryFormat.TABLE).instant()
        builder = builder.with_target(target)
    return builder


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    board = (
        dashboard.Dashboard(TITLE).uid(UID).tags(["encoderpool"]).refresh("30s").time("now-1h", "now")
        .timezone("browser").editable().description(
            "Encoder pools (encoderpool.io): throughput, latency by stage, batching and admission, errors, cache, "
            "workers, delivery, and the operator. Per pool and per pod."
        )
    )
    for variable in _variables():
        board = board.with_variable(variable)
    panel_id = 1
    for title, panels in ROWS:
        board = board.with_row(dashboard.Row(title).id(panel_id))
        panel_id += 1
        for spec in panels:
            board = board.with_panel(_panel(spec, panel_id))
            panel_id += 1
    model: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return model


def render() -> str:
    """The file's text: stable key order, two-space indent, a final newline."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the committed dashboard JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs from the generator's output")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is not what monitoring/dashboard.py makes: run `python -m monitoring.dashboard`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
