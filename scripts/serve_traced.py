"""The app as `python app.py` starts it, logging where a concurrency measurement's time goes
(`python scripts/measure_concurrency.py --trace DIR` starts the server with it and summarises the logs):

    EAGLEVIZ_TRACE_DIR=DIR python scripts/serve_traced.py

    DIR/steps.jsonl   each model step (a run's prefill with its first cycle, or one cycle), taken in its turn:
                      its end (time.monotonic, the clock every process on the machine shares), its wall and CPU
                      seconds, and whether it was the run's first
    DIR/gc.jsonl      each collection of generation 1 or 2: its start and seconds (Python's `gc.callbacks`)

Wall time above CPU time is time the step waited for the interpreter lock or a core while it held the model.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleviz.app import scheduler  # noqa: E402


def main() -> None:
    out = Path(os.environ["EAGLEVIZ_TRACE_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    steps, collections = (out / "steps.jsonl").open("w", buffering=1), (out / "gc.jsonl").open("w", buffering=1)
    step = scheduler.Paced.__next__

    def traced(self):
        first, busy, cpu = self._steps == 0, self.busy_s, time.thread_time()
        try:
            return step(self)
        finally:  # waiting for the turn costs no CPU: the thread's CPU time is the step's
            steps.write(json.dumps({"end": time.monotonic(), "wall": self.busy_s - busy,
                                    "cpu": time.thread_time() - cpu, "first": first}) + "\n")

    started: dict[int, float] = {}

    def collected(phase: str, info: dict) -> None:
        generation = info["generation"]
        if phase == "start":
            started[generation] = time.monotonic()
        elif generation >= 1:
            collections.write(json.dumps({"generation": generation, "start": started[generation],
                                          "seconds": time.monotonic() - started[generation]}) + "\n")

    scheduler.Paced.__next__ = traced
    gc.callbacks.append(collected)
    sys.argv = [str(ROOT / "app.py")]
    runpy.run_path(str(ROOT / "app.py"), run_name="__main__")


if __name__ == "__main__":
    main()
