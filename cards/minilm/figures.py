"""Draw cards/minilm/{seeds,expected_max}_{mrpc,rte}.png from the per-seed
scores in seeds.yaml beside them, as bertkit-report draws them (its plot and expected-maximum
functions); the runs' own records were lost with their session (seeds.yaml says so).

    python cards/minilm/figures.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bertkit.reporting.plots import plot_expected_max, plot_seeds
from bertkit.reporting.statistics import expected_max_curve

HERE = Path(__file__).parent


def main() -> None:
    tasks = yaml.safe_load((HERE / "seeds.yaml").read_text(encoding="utf-8"))
    for task, spec in tasks.items():
        rows = spec["rows"]
        plot_seeds(rows, HERE / f"seeds_{task}.png",
                   f"{spec['header']}: seeds at the best grid point", spec["metric"])
        curves = {name: list(expected_max_curve(values)) for name, values in rows.items()}
        plot_expected_max(curves, HERE / f"expected_max_{task}.png", spec["header"],
                          spec["metric"])


if __name__ == "__main__":
    main()
