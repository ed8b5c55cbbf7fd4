"""Pipeline files read with the registered view kinds (`views.kinds.FILES`): `load_pipeline(path)` and
`parse_pipeline(text, file)` (`spec.load` with the kinds), and which pipeline a command uses: the file
`MVIEW_PIPELINE` names, or the built-in pipeline shipped with the project (`timeline_demo/pipelines/builtin.yml`).
`pipeline_at` loads a file once per content (its modification time) and environment (`${VAR}` in the file), so a
long-running process sees an edited file on its next call."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

from spec import load
from spec.model import Pipeline
from views.kinds import FILES

__all__ = [
    "load_pipeline",
    "parse_pipeline",
    "BUILTIN_FILE",
    "pipeline_file",
    "pipeline_at",
    "builtin_pipeline",
    "default_pipeline",
]

BUILTIN_FILE = Path(__file__).resolve().parents[1] / "timeline_demo" / "pipelines" / "builtin.yml"


def parse_pipeline(text: str, file: str, env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline in `text` (read from `file`, named in messages), `${VAR}` taken from `env` (default: the process
    environment); raises `spec.errors.PipelineError` with every problem found (`spec.load.parse_pipeline`)."""
    return load.parse_pipeline(text, file, env, kinds=FILES)


def load_pipeline(path: str | Path, env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline of the file at `path` (see `parse_pipeline`); a file that cannot be read is one problem too."""
    return load.load_pipeline(path, env, kinds=FILES)


def pipeline_file(env: Mapping[str, str] | None = None) -> str:
    """The pipeline file of `env` (default: the process environment): `MVIEW_PIPELINE`, else the built-in one."""
    env = os.environ if env is None else env
    return env.get("MVIEW_PIPELINE", "").strip() or str(BUILTIN_FILE)


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, env: frozenset) -> Pipeline:
    return load_pipeline(path, dict(env))


def pipeline_at(path: str, env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline of the file at `path` with `${VAR}` from `env` (default: the process environment), loaded once
    per file content (modification time) and environment."""
    env = os.environ if env is None else env
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError:
        mtime = -1  # the loader says what is wrong with the file
    return _load(path, mtime, frozenset(env.items()))


def builtin_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """The built-in pipeline (the contract's six topics and three jobs), `${VAR}` taken from `env`."""
    return pipeline_at(str(BUILTIN_FILE), env)


def default_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline of `pipeline_file(env)`; raises `spec.errors.PipelineError` when it is not a valid one."""
    return pipeline_at(pipeline_file(env), env)
