"""What a long measurement has finished, one JSON line per prompt, so an interrupted run picks up where it stopped.

    Journal(path, header, name)   the file's first line is the run's settings (`header`); each later line one
                                  finished prompt. `done()` gives the finished prompts of a journal written with
                                  exactly these settings (a journal of other settings is never mixed in: the run
                                  starts afresh and says which settings differed); `run(count, work)`
                                  finishes the rest, one `work(i)` per prompt, with progress and an ETA;
                                  `close` removes the file once the result is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path


class Journal:
    def __init__(self, path: Path | None, header: dict, name: str, progress=print):
        self.path, self.header, self.name, self.progress = path, json.loads(json.dumps(header)), name, progress

    def done(self) -> list:
        """The finished prompts' records, in order (none when there is no journal of these settings). A line torn
        by an interruption and the lines after it are dropped: those prompts run again."""
        if self.path is None or not self.path.exists():
            return self._start()
        try:
            lines = self.path.read_text().splitlines()
            recorded = json.loads(lines[0])
        except (ValueError, TypeError, IndexError):  # a torn header or a foreign file: start afresh
            return self._start()
        if recorded != self.header:
            differ = sorted(k for k in set(recorded) | set(self.header) if recorded.get(k) != self.header.get(k))
            self.progress(f"[{self.name}] {self.path} was written with other settings ({', '.join(differ)}): "
                          "starting afresh")
            return self._start()
        records = []
        for line in lines[1:]:
            try:
                records.append(json.loads(line))
            except ValueError:
                self.progress(f"[{self.name}] {self.path}: prompt {len(records) + 1}'s line is torn; it runs again")
                self.path.write_text("".join(f"{kept}\n" for kept in lines[:len(records) + 1]))
                break
        return records

    def _start(self) -> list:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.header) + "\n")
        return []

    def run(self, count: int, work: Callable[[int], object], label: str | None = None) -> list:
        """The records of prompts 0..count-1: the finished ones from the journal, the others by `work(i)` (a
        JSON-able record), each appended as it finishes and reported with an ETA."""
        records = self.done()
        start, first = time.perf_counter(), len(records)
        if first:
            self.progress(f"[{label or self.name}] resuming after prompt {first}/{count} ({self.path})")
        for i in range(first, count):
            records.append(work(i))
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps(records[-1]) + "\n")
            eta = (time.perf_counter() - start) / (i + 1 - first) * (count - i - 1)
            self.progress(f"[{label or self.name}] prompt {i + 1}/{count}  ETA {eta:5.0f} s")
        return records

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
