"""The successive-halving section of bertkit-report: every halving.json under the outputs
directory (one per sweep=paper_grid_halving launch), its rungs and the compute it saved. (The
halving itself, which writes halving.json, is bertkit.sweeps.halving.)"""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.data.atomic_files import DamagedFile, read_json
from bertkit.errors import BertkitError

LEDGER_FILE = "halving.json"


def collect_halving(root: Path) -> list[dict]:
    """[{"path": relative path, "eta", "fractions", "rungs": [...], "compute": {...}}]; a
    ledger cut or corrupt is {"path", "error"}, named in the section."""
    root = Path(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if LEDGER_FILE not in filenames:
            continue
        path = Path(dirpath) / LEDGER_FILE
        try:
            data = read_json(path)
            rungs = [{key: rung[key] for key in ("rung", "fraction", "configurations", "jobs",
                                                 "continued_configurations")}
                     for rung in data["rungs"]]
            entry = {"path": path.relative_to(root).as_posix(), "eta": data["eta"],
                     "fractions": data["fractions"], "rungs": rungs,
                     "compute": data["compute"], "wall_seconds": data.get("wall_seconds")}
        except DamagedFile as err:  # named in the section; the rest of the report goes on
            entry = {"path": path.relative_to(root).as_posix(), "error": str(err)}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BertkitError(f"{path}: not a successive-halving ledger: {err!r}") from None
        found.append(entry)
    return found


def render_halving(ledgers: list[dict]) -> list[str]:
    """Markdown lines of the section (empty when no sweep used successive halving)."""
    if not ledgers:
        return []
    out = ["", "## Successive halving", "",
           "Stopped configurations are left out of the tables above; their partial dev scores "
           "stay in their metrics.json (`train.complete: false`)."]
    for ledger in ledgers:
        if "error" in ledger:
            out += ["", f"`{ledger['path']}`: unreadable ledger: {ledger['error']}"]
            continue
        compute = ledger["compute"]
        out += ["", f"`{ledger['path']}` (eta {ledger['eta']:g}):", "",
                "| rung | share of each schedule | configurations | jobs | continued |",
                "|---|---|---|---|---|"]
        out += [f"| {r['rung']} | {r['fraction']:.0%} | {r['configurations']} | {r['jobs']} | "
                f"{r['continued_configurations']} |" for r in ledger["rungs"]]
        saved = compute.get("saved_fraction")
        if saved is not None:
            out += ["", f"Training examples: {compute['examples_trained']:,} of "
                        f"{compute['examples_full_grid']:,} for the full grid "
                        f"(**{saved:.0%} saved**); training time {compute['train_seconds']:.0f} s "
                        f"vs {compute['train_seconds_full_grid_estimate']:.0f} s estimated for "
                        f"the full grid at each job's measured speed."]
    return out
