"""How many of bertkit's files a job runs functions in, from the `bertkit` command to
`Trainer.train`: the measure of how far a reader must go to follow one job (issue 62).

Counted with `sys.setprofile` in the process the `bertkit` command starts: every distinct file of
`bertkit/` and `hydra_plugins/` one of whose functions is called, except calls made while a
module is being imported (a decorator or a registry filled at import is part of reading that
module, not of following the job). The job stops at the first `Trainer.train` call, before a
step is taken, so counting costs the job's set-up only.

    python tests/job_files.py finetune      # the demo finetune (`make demo`)
    python tests/job_files.py pretrain      # the small pretraining run
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The jobs counted: the command line of each after `bertkit`, as a user types it.
JOBS = {
    "finetune": ["logger=none"],
    "pretrain": ["experiment=pretrain_small", "logger=none"],
}
ROOTS = ("bertkit", "hydra_plugins")


def count(job: str, run_dir: Path) -> list[str]:
    """The files (relative to the repository) whose functions the job runs before training."""
    out = run_dir / "job_files.json"
    command = [sys.executable, __file__, "--inside", str(out), *JOBS[job],
               f"hydra.run.dir={run_dir / 'run'}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if not out.exists():
        raise RuntimeError(f"{job} ended before Trainer.train (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _profile_until_training(out: Path) -> None:
    """In the job's process: record the files, and stop the process at Trainer.train."""
    import transformers

    roots = tuple(str(REPO / root) + os.sep for root in ROOTS)
    seen: set[str] = set()

    def during_import(frame) -> bool:
        while frame is not None and frame.f_code.co_filename != __file__:
            if frame.f_code.co_name == "<module>":
                return True
            frame = frame.f_back
        return False

    def profile(frame, event, _arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path in seen or not path.startswith(roots) or during_import(frame):
            return
        seen.add(path)

    def stop(*_args, **_kwargs):
        sys.setprofile(None)
        files = sorted(str(Path(path).relative_to(REPO)) for path in seen)
        out.write_text(json.dumps(files, indent=1))
        sys.stdout.flush()
        os._exit(0)

    transformers.Trainer.train = stop
    sys.setprofile(profile)


def main() -> None:
    if sys.argv[1:2] == ["--inside"]:
        _profile_until_training(Path(sys.argv[2]))
        sys.argv = ["bertkit", *sys.argv[3:]]
        sys.path.insert(0, str(REPO))
        from bertkit.cli import main as bertkit_main

        # The CLI module's own import is not counted; calling it is.
        bertkit_main()
        raise SystemExit("the job returned without calling Trainer.train")
    for job in sys.argv[1:] or list(JOBS):
        with tempfile.TemporaryDirectory() as tmp:
            files = count(job, Path(tmp))
        print(f"{job}: {len(files)} files")
        for name in files:
            print(f"  {name}")


if __name__ == "__main__":
    main()
