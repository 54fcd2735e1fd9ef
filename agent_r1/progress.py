"""Progress for long work: a live bar on a terminal, throttled log lines elsewhere (CI, files)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn


class Progress:
    """``with progress.task("rl", total=n) as report: report("it 3 reward 0.4", 3 / n)``."""

    def __init__(self, enabled: bool = True, console: Console | None = None, interval_s: float = 5.0):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.interval_s = interval_s

    @classmethod
    def null(cls) -> "Progress":
        return cls(enabled=False)

    @contextmanager
    def task(self, label: str, total: int | None = None) -> Iterator[Callable[[str, float | None], None]]:
        if not self.enabled:
            yield lambda desc, frac=None: None
            return
        t0 = time.perf_counter()
        if self.console.is_terminal:
            with RichProgress(TextColumn("[bold]{task.fields[label]}"), BarColumn(), TextColumn("{task.description}"),
                              TimeElapsedColumn(), console=self.console, transient=False) as bar:
                tid = bar.add_task("", total=1.0, label=label)

                def report(desc: str, frac: float | None = None) -> None:
                    bar.update(tid, description=desc, completed=frac if frac is not None else None)

                yield report
                bar.update(tid, completed=1.0)
            return
        last = [0.0]

        def report(desc: str, frac: float | None = None) -> None:
            now = time.perf_counter()
            if now - last[0] >= self.interval_s or (frac is not None and frac >= 1.0):
                last[0] = now
                pct = f" {100 * frac:3.0f}%" if frac is not None else ""
                print(f"[{label}{pct} {now - t0:6.1f}s] {desc}", file=sys.stderr, flush=True)

        yield report
        print(f"[{label}] done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
