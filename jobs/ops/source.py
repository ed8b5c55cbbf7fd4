"""A deployed source job (`JobSpec.source`: it copies an outside system into the topics' logs; no Spark, no
Redis, no generations): `python -m jobs run JOB` without `--once`.

Holds the job's lease on the lake for its lifetime (`jobs.ops.service._single_instance`: two copies never run at
once, on any machines; one that loses the lease stops), records its pid and state in the status file, and runs
the job's runner with `once=False` until SIGTERM/SIGINT (`runtime.STOP`); the runner retries failures of its
outside system itself. A runner that raises ends the process with exit 1 and `state: "failed"`,
its error in `error` (one line); the next start moves it to `previous_error`.
"""

from __future__ import annotations

import os
import time

from jobs.core.registry import job_spec
from jobs.core.runtime import clear_error, log, write_status
from jobs.core.settings import Settings
from jobs.ops.service import _single_instance, _stop_on_signals

__all__ = ["serve_source"]


def serve_source(settings: Settings, job: str) -> int:
    spec = job_spec(settings, job)
    lock = _single_instance(settings, spec.name)
    if lock is None:
        return 1
    _stop_on_signals(spec.name)
    clear_error(settings, spec.name)  # why an earlier run failed: history now
    write_status(settings, spec.name, pid=os.getpid(), state="starting", started_ms=int(time.time() * 1000))
    state = "stopped"
    try:
        spec.run(None, settings, once=False)
    except Exception as e:
        state = "failed"
        log(f"{spec.name}: {e}")
        write_status(settings, spec.name, error=e)  # one line, credentials masked (`write_status`)
        raise
    finally:
        write_status(settings, spec.name, state=state, stopped_ms=int(time.time() * 1000))
        log(f"{spec.name}: {state}")
        lock.release()
    return 0
