"""Where a micro-batch's time goes, for its log line: `Phases`."""

from __future__ import annotations

import time

from jobs.core.runtime import process_cpu
from joins.sparkapi import codegen_compilations, driver_jvm

__all__ = ["Phases"]


class Phases:
    """Wall time, JVM CPU time (driver + local executors; local mode only, else nan) and Python worker CPU time
    (the JVM's descendant processes: a sink's workers) of the phases of one step, and the number of
    generated-code compilations (cc). `mark(name)` ends a phase; `str()` is the log line's text:
    `<name> <wall>s/<jvm>cpu/<python>py/<n>cc, ...; <n> code compilations (cc)`."""

    def __init__(self, spark):
        self._cpu = lambda: (float("nan"), float("nan"))
        # local mode: the JVM started by this driver runs the executors too
        proc = driver_jvm(spark)
        if proc is not None:

            def cpu() -> tuple[float, float]:
                try:
                    return process_cpu(proc.pid)
                except (OSError, IndexError, ValueError):
                    return float("nan"), float("nan")

            self._cpu = cpu
        try:
            self._compiles = codegen_compilations(spark)
            self._compiles()
        except Exception:  # noqa: BLE001 - no codegen metric (e.g. Spark Connect): count 0
            self._compiles = lambda: 0
        self.marks: list[tuple[str, float, float, float, int]] = []
        self._t, self._c, self._n = time.monotonic(), self._cpu(), self._compiles()
        self._k = self._n

    def mark(self, name: str) -> None:
        """End the phase `name` (it began at the previous mark, or when this object was made)."""
        t, c, k = time.monotonic(), self._cpu(), self._compiles()
        self.marks.append((name, t - self._t, c[0] - self._c[0], c[1] - self._c[1], k - self._k))
        self._t, self._c, self._k = t, c, k

    def seconds(self) -> dict[str, float]:
        """Wall seconds of each phase ended so far."""
        return {name: wall for name, wall, *_ in self.marks}

    def __str__(self) -> str:
        parts = ", ".join(f"{n} {w:.2f}s/{c:.2f}cpu/{p:.2f}py/{k}cc" for n, w, c, p, k in self.marks)
        return f"{parts}; {self._compiles() - self._n} code compilations (cc)"

    def after(self, name: str, fn):
        """`fn`, then `mark(name)`: a function that ends the phase `name` when `fn` returns."""

        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.mark(name)
            return out

        return run
