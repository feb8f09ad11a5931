"""The methods table of cards/finetuning.md, recomputed from the run records here.

    python cards/finetuning/methods_table.py mrpc [--seeds 1,2,3,4,5]

Why a side script and not bertkit-report (which prints the card's STS-B tables and MRPC's
recorded arms, with the commands the card shows): the report cannot draw two things.
MRPC's first seven arms ran in a session whose run directories were lost: runs/mrpc/printed.yaml
holds what the card printed of them, and a record (seed_<k>/metrics.json) wins over it; the
report has no records of them to read. And the report compares the main metric only: the
per-seed scores, the secondary metric's test (accuracy for MRPC, Pearson for STS-B), the mean
final training loss and the median training seconds are this script's columns.

One row per arm of runs/<task>/: per-seed dev scores, the difference to the full arm with
Welch's interval and p, Holm's p over every row of the table, ASO's ε_min both ways
(Bonferroni over the rows), the seeds per arm that would detect 1 point, the secondary
metric's difference and Welch p, mean final training loss and median training seconds. The
tests and their settings are bertkit-report --compare's own (bertkit.reporting.statistics at
Significance's defaults). Arms with fewer than two seeds are listed, not tested.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml
from scipy import stats

from bertkit.reporting.statistics import aso_epsilon, compare_groups, holm_adjust, seeds_needed
from bertkit.reporting.writer import Significance

HERE = Path(__file__).parent / "runs"
ORDER = ["full", "llrd", "reinit", "mean_pooling", "freeze", "layer_mix", "gradual_unfreezing",
         "lora", "lora_pooler", "r3f", "stilts", "stilts_fresh_pooler"]
# Follow-ups: an arm changed in one respect after its row was measured, tested against that
# row as well as against full (LoRA with BERT's pooler trained; STILTs with a fresh pooler).
FOLLOW_UPS = {"lora_pooler": "lora", "stilts_fresh_pooler": "stilts"}
SECONDARY = {"f1": "accuracy", "spearman": "pearson"}
NAMES = {"mrpc": ("F1", "accuracy"), "stsb": ("Spearman", "Pearson")}
SETTINGS = Significance()


def from_records(arm_dir: Path, seeds: list[int]) -> dict | None:
    runs = {}
    for seed in seeds:
        path = arm_dir / f"seed_{seed}" / "metrics.json"
        if path.exists():
            runs[seed] = json.loads(path.read_text())
    if not runs:
        return None
    first = next(iter(runs.values()))
    main = first["main_metric"]
    second = SECONDARY[main]
    ordered = [runs[s] for s in sorted(runs)]
    return {"seeds": sorted(runs),
            "main": [100 * r["validation"]["validation"][main] for r in ordered],
            "secondary": [100 * r["validation"]["validation"][second] for r in ordered],
            "loss": statistics.fmean(r["train"]["loss"] for r in ordered),
            "seconds": statistics.median(r["train"]["training_seconds"] for r in ordered),
            "source": "records"}


def from_printed(entry: dict, seeds: list[int]) -> dict:
    main = [entry["main"][s - 1] for s in seeds if s <= len(entry["main"])]
    arm = {"seeds": seeds[:len(main)], "main": main, "loss": entry["loss"],
           "seconds": entry["seconds"], "source": "printed"}
    if "secondary" in entry:
        arm["secondary"] = [entry["secondary"][s - 1] for s in arm["seeds"]]
    else:
        arm["secondary_mean_std"] = tuple(entry["secondary_mean_std"])
    return arm


def mean_std(arm: dict) -> tuple[float, float]:
    if "secondary" in arm:
        values = arm["secondary"]
        return (statistics.fmean(values),
                statistics.stdev(values) if len(values) > 1 else float("nan"))
    return arm["secondary_mean_std"]


def load(task: str, seeds: list[int]) -> dict[str, dict]:
    printed_file = HERE / task / "printed.yaml"
    printed = yaml.safe_load(printed_file.read_text()) if printed_file.exists() else {}
    arms = {}
    for name in ORDER:
        arm = from_records(HERE / task / name, seeds)
        if arm is None and name in printed:
            arm = from_printed(printed[name], seeds)
        if arm is not None:
            arms[name] = arm
    return arms


def table(task: str, seeds: list[int]) -> str:
    arms = load(task, seeds)
    full = arms["full"]
    tested = [n for n, a in arms.items() if n != "full" and len(a["main"]) >= 2]
    welch = {n: compare_groups(full["main"], arms[n]["main"], SETTINGS.confidence)
             for n in tested}
    holm = holm_adjust({n: w["p_value"] for n, w in welch.items()})
    main, second = NAMES[task]
    rows = [f"| arm | seeds | dev {main} per seed | {main} mean ± std | − full, {main} [95 % CI] "
            f"| Welch p | Holm p | ε_min, arm better | ε_min, full better | seeds for 1 point | "
            f"{second} (− full, p) | final train loss | training time (median) |",
            "|---" * 13 + "|"]
    full_m, full_s = mean_std(full)
    for name, arm in arms.items():
        scores = " / ".join(f"{v:.2f}" for v in arm["main"])
        spread = statistics.stdev(arm["main"]) if len(arm["main"]) > 1 else float("nan")
        head = (f"| {name} | {','.join(map(str, arm['seeds']))} | {scores} | "
                f"**{statistics.fmean(arm['main']):.2f} ± {spread:.2f}** |")
        m, s = mean_std(arm)
        tail = f" {arm['loss']:.3f} | {arm['seconds']:.0f} s |"
        if name == "full":
            rows.append(head + " — | — | — | — | — | — |" + f" {m:.2f} ± {s:.2f} |" + tail)
            continue
        if name not in welch:
            rows.append(head + " (fewer than 2 seeds) | | | | | |" + f" {m:.2f} |" + tail)
            continue
        w = welch[name]
        better, worse = (aso_epsilon(a, b, SETTINGS.confidence, len(tested), SETTINGS.seed,
                                     SETTINGS.aso_iterations)
                         for a, b in ((full["main"], arm["main"]), (arm["main"], full["main"])))
        needed = seeds_needed(statistics.stdev(full["main"]), statistics.stdev(arm["main"]),
                              SETTINGS.detect, 1 - SETTINGS.confidence, SETTINGS.power)
        p2 = stats.ttest_ind_from_stats(m, s, len(arm["main"]), full_m, full_s,
                                        len(full["main"]), equal_var=False).pvalue
        rows.append(head + f" {w['difference']:+.2f} [{w['ci_low']:+.2f}, {w['ci_high']:+.2f}] | "
                    f"{w['p_value']:.3f} | {holm[name]:.3f} | {better:.2f} | {worse:.2f} | "
                    f"{needed if needed is not None else '> 10000'} | "
                    f"{m:.2f} ± {s:.2f} ({m - full_m:+.2f}, {p2:.2f}) |" + tail)
    sources = ", ".join(f"{n}: {a['source']}" for n, a in arms.items())
    return "\n".join(rows) + follow_ups(arms, main) + f"\n\n(from {sources})"


def follow_ups(arms: dict[str, dict], main: str) -> str:
    """Each follow-up against the arm it changes (Welch, ASO both ways; no Holm: one test each)."""
    pairs = [(new, old) for new, old in FOLLOW_UPS.items()
             if new in arms and old in arms and min(len(arms[new]["main"]),
                                                    len(arms[old]["main"])) >= 2]
    if not pairs:
        return ""
    rows = ["", "", f"| follow-up | − its arm, {main} [95 % CI] | Welch p "
            f"| ε_min, follow-up better | ε_min, arm better |", "|---|---|---|---|---|"]
    for new, old in pairs:
        a, b = arms[old]["main"], arms[new]["main"]
        w = compare_groups(a, b, SETTINGS.confidence)
        better, worse = (aso_epsilon(x, y, SETTINGS.confidence, 1, SETTINGS.seed,
                                     SETTINGS.aso_iterations) for x, y in ((a, b), (b, a)))
        rows.append(f"| {new} − {old} | {w['difference']:+.2f} [{w['ci_low']:+.2f}, "
                    f"{w['ci_high']:+.2f}] | {w['p_value']:.3f} | {better:.2f} | {worse:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    args = parser.parse_args()
    print(table(args.task, [int(s) for s in args.seeds.split(",")]))


if __name__ == "__main__":
    main()
