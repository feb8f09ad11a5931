"""Runs several bertkit jobs one after another in one launch: `python -m tests.training.run_jobs
JOBS.json`, alone or under torchrun (every process runs every job, as a sweep's jobs run in
one process). JOBS.json: a list of {"overrides": [...], "run_dir": "..."}. One launch serves
every test that reads the runs: each process costs seconds to start, torchrun more. A job that
fails is recorded in its run directory (run_jobs_error.txt); alone, the next job runs; under
torchrun the launch ends there (exit 1, torchrun stops the other processes), since a process
that went on to the next job would leave the others waiting in a collective.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ERROR_FILE = "run_jobs_error.txt"


def main(jobs_file: str) -> None:
    from bertkit.jobs import run_job
    from tests.conftest import compose_config

    for job in json.loads(Path(jobs_file).read_text()):
        run_dir = Path(job["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            run_job(compose_config(job["overrides"]), run_dir=run_dir)
        except Exception:  # noqa: BLE001 - the test reads the error
            (run_dir / ERROR_FILE).write_text(traceback.format_exc())
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                sys.stderr.write(traceback.format_exc())
                os._exit(1)  # no interpreter teardown: gloo's threads may be mid-collective
    if "torch" in sys.modules:
        import torch

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
