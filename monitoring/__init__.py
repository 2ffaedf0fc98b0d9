"""Observability of encoder pools: the Grafana dashboard's generator, its queries, and its pictures.

Not part of the ``encoderpool`` distribution (like ``bench/``): a development tool whose outputs
are committed, the dashboard JSON in the chart (``charts/encoderpool-operator/dashboards/``) and
the pictures in ``docs/``.
"""
