"""Which fence a process's Redis writes of a job carry, and whether it may still commit (`jobs.core.lease`,
`views.fence`): the epoch of the lease this process acquired for the job is its fencing token."""

from __future__ import annotations

from jobs.core.lease import held
from jobs.core.runtime import job_lease_key, replay_lease_key
from jobs.errors import LeaseLost
from views.fence import UNFENCED, Fence

__all__ = ["writer_fence", "check_lease"]


def writer_fence(job: str) -> Fence:
    """The fence this process's writes of `job` carry (`views.fence`): the epoch of the job's lease when this
    process acquired it (a deployed driver, `run --once`, a rebuild inside either), else of the job's replay lease
    (`mview replay`, fence `<job>.replay`), else none (`UNFENCED`: a run outside the CLI)."""
    for key, name in ((job_lease_key(job), job), (replay_lease_key(job), f"{job}.replay")):
        lease = held(key)
        if lease is not None:
            return Fence(name, lease.epoch)
    return UNFENCED


def check_lease(job: str) -> None:
    """Raise `LeaseLost` when this process acquired `job`'s lease and it is not valid now (lost, or in doubt):
    checked before a micro-batch writes and again before Spark commits it, so a driver that is no longer sure to
    hold the lease commits nothing to the lake's checkpoint and writes nothing to the status."""
    lease = held(job_lease_key(job))
    if lease is not None and not lease.valid:
        raise LeaseLost(job, lease.lost_reason or "it could not be renewed in time")
