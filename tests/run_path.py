"""The files of the repository a run goes through, from run_job to Trainer.train, counted from
the calls themselves (sys.setprofile), so that docs/architecture.md's run path is measured,
not remembered.

A file is *entered* when a function defined in it is called from a function of another file
of the repository (library frames in between, a Hydra or Trainer callback, are skipped: the
call counts from the last repository frame below it); module bodies (imports) do not count.
It *comes back* when a file already entered is entered again, and it is *called back* when
it is entered from a function that it called itself, directly or not (a file on the stack
below the caller: the reader is sent back to a file they were still reading). Two readings:

- every call: all the functions a run calls, down to the leaves (a cache entry's fingerprint);
- the run path: the functions on the stack when Trainer.train is called (run_job, the job's
  main function, ...) and the functions they call themselves: what a reader of the job opens.

    python -m tests.run_path recipe=demo ...         # from run_job, for any job
    python -m tests.run_path --cli recipe=demo ...   # from the `bertkit` command (Hydra too)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = (str(ROOT / "bertkit") + os.sep, str(ROOT / "hydra_plugins") + os.sep)


class _Reached(BaseException):
    """Raised at Trainer.train's call: nothing after it is counted (a BaseException, so that
    no handler of Hydra's or bertkit's on the way up takes it for an error)."""


@dataclass
class Entry:
    file: str
    function: str
    caller: str | None
    on_path: bool = False  # the callee's frame, or its caller's, is on the stack at Trainer.train
    called_back: bool = False  # the callee's file is on the stack below its caller


@dataclass
class RunPath:
    entries: list[Entry] = field(default_factory=list)

    @staticmethod
    def _count(entries: list[Entry]) -> dict:
        files: list[str] = []
        back = 0
        for entry in entries:
            if entry.file in files:
                back += 1
            else:
                files.append(entry.file)
        return {"files": len(files), "comes_back": back,
                "called_back": sum(entry.called_back for entry in entries), "in_order": files}

    def every_call(self) -> dict:
        return self._count(self.entries)

    def run_path(self) -> dict:
        return self._count([entry for entry in self.entries if entry.on_path])


def _repository_frame(frame):
    while frame is not None and not frame.f_code.co_filename.startswith(REPOSITORY):
        frame = frame.f_back
    return frame


def _relative(frame) -> str | None:
    return None if frame is None else os.path.relpath(frame.f_code.co_filename, ROOT)


def trace(run) -> RunPath:
    """Calls run() and records every file entry until Trainer.train is called (run stops
    there)."""
    calls = []  # (callee frame, caller frame): kept alive, so that no frame id is reused

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "train" and code.co_filename.endswith(
                os.path.join("transformers", "trainer.py")):
            stack = set()
            below = frame.f_back
            while below is not None:
                stack.add(id(below))
                below = below.f_back
            for callee, caller, entry in calls:
                entry.on_path = id(callee) in stack or (caller is not None
                                                        and id(caller) in stack)
            raise _Reached
        if not code.co_filename.startswith(REPOSITORY) or code.co_name == "<module>":
            return
        caller = _repository_frame(frame.f_back)
        if caller is None or caller.f_code.co_filename != code.co_filename:
            below, back = caller and caller.f_back, False
            while below is not None and not back:
                back = below.f_code.co_filename == code.co_filename
                below = below.f_back
            calls.append((frame, caller, Entry(_relative(frame), code.co_name,
                                               _relative(caller), called_back=back)))

    sys.setprofile(profile)
    try:
        run()
    except _Reached:
        pass
    finally:
        sys.setprofile(None)
    return RunPath([entry for _, _, entry in calls])


def main() -> None:
    from bertkit.jobs import run_job
    from tests.conftest import compose_config

    overrides = [argument for argument in sys.argv[1:] if argument != "--cli"]
    run_dir = Path(os.environ.get("RUN_PATH_DIR", "/tmp/bertkit-run-path"))
    if "--cli" in sys.argv:
        from bertkit.cli import main as command

        sys.argv = ["bertkit", *overrides, "overwrite=true", f"hydra.run.dir={run_dir}"]
        path = trace(command)
    else:
        path = trace(lambda: run_job(compose_config([*overrides, "overwrite=true"]), run_dir))
    every = path.every_call()
    del every["in_order"]
    print(json.dumps({"every_call": every,
                      "run_path": {**path.run_path(),
                                   "calls": [f"{e.caller} -> {e.file}:{e.function}"
                                             + (" (called back)" if e.called_back else "")
                                             for e in path.entries if e.on_path]}},
                     indent=1))


if __name__ == "__main__":
    main()
