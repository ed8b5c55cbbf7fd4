"""Errors of the pipeline declarations: every problem names the file, the line and the key it is about."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Problem", "PipelineError"]


@dataclass(frozen=True)
class Problem:
    """One problem of a pipeline file: `<file>:<line>: <key>: <message>` (key: the dotted path, e.g.
    `jobs.paid.interval.within`; line 0 when the file itself is the problem)."""

    file: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class PipelineError(Exception):
    """A pipeline that cannot be used: `problems`, one line each (`str(error)` joins them)."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
