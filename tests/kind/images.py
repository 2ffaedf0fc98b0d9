"""The image references the tier runs: the chart's defaults, which hack/images.sh builds."""

from __future__ import annotations

from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "encoderpool-operator"


def _chart_images() -> tuple[str, str, str]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = values["image"]
    operator = f"{image['repository']}:{image['tag'] or chart['appVersion']}"
    return operator, values["encoderImage"]["cpu"], values["encoderImage"]["cuda"]


OPERATOR_IMAGE, ENCODER_CPU_IMAGE, ENCODER_CUDA_IMAGE = _chart_images()
