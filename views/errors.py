"""Errors of the views layer. Every message that names a Redis URL shows it through `redact_url` and its causes
through `redact` (`changelog.errors`: the one redaction of credentials, re-exported here)."""

from __future__ import annotations

from changelog.errors import redact, redact_url
from changelog.errors import url_password as _password

__all__ = [
    "ViewError",
    "RedisUnavailable",
    "RedisMisconfigured",
    "RedisAuthFailed",
    "RedisTLSMismatch",
    "RedisNotCluster",
    "UnknownView",
    "WrongJob",
    "WrongViewKind",
    "RedisCommandFailed",
    "Fenced",
    "redact_url",
    "redact",
]


class ViewError(Exception):
    """Root of every error raised by `views`."""


class RedisUnavailable(ViewError):
    """Nothing answers at the Redis URL (refused, timed out, the process is stopping): possibly temporary."""

    def __init__(self, url: str, cause: Exception | str | None = None):
        self.url = redact_url(url)
        self.cause = redact(cause, url) if cause is not None else None
        detail = f" ({self.cause})" if self.cause else ""
        super().__init__(
            f"cannot reach Redis at {self.url}{detail}: start one with `make redis` or point REDIS_URL at a "
            "running server"
        )


class RedisMisconfigured(ViewError):
    """Redis answers but the connection settings cannot work (credentials, TLS): retrying cannot help, REDIS_URL
    or the server must change. `url` is redacted."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = redact_url(url)


def _shown(url: str, cause) -> tuple[str, str]:
    """(the URL, the cause) as a message may show them: credentials masked."""
    return redact_url(url), redact(cause, url) if cause is not None else ""


class RedisAuthFailed(RedisMisconfigured):
    """The server refused the credentials of the URL, or requires some and the URL has none."""

    def __init__(self, url: str, cause: Exception | str | None = None):
        shown, detail = _shown(url, cause)
        if _password(url) is None:
            message = (
                f"the server at {shown} requires a password: put it in REDIS_URL as "
                "redis://:PASSWORD@host:port/db"
            )
        else:
            message = (
                f"the server at {shown} refused the credentials ({detail}): correct the user and password in "
                "REDIS_URL (redis://[USER]:PASSWORD@host:port/db)"
            )
        super().__init__(message, url)


class RedisTLSMismatch(RedisMisconfigured):
    """TLS on one side only (rediss:// to a plain port or redis:// to a TLS port), or a failed TLS handshake."""

    def __init__(self, url: str, cause: Exception | str | None = None):
        shown, detail = _shown(url, cause)
        if str(url).lower().startswith("rediss://"):
            message = (
                f"TLS handshake with the server at {shown} failed ({detail}): use redis:// for a plain port, "
                "rediss:// only for a TLS port (with ?ssl_ca_certs=PATH if its certificate is not publicly "
                "trusted)"
            )
        else:
            message = (
                f"the server at {shown} speaks TLS ({detail}): use rediss:// for a TLS port, redis:// for a "
                "plain one"
            )
        super().__init__(message, url)


class RedisNotCluster(RedisMisconfigured):
    """REDIS_CLUSTER=true, but the server at the URL is not a Redis Cluster node (`cluster_enabled:0`)."""

    def __init__(self, url: str):
        super().__init__(
            f"REDIS_CLUSTER=true but the server at {redact_url(url)} is not a Redis Cluster node: point REDIS_URL "
            "at a node of the cluster, or unset REDIS_CLUSTER for a single server",
            url,
        )


class UnknownView(ViewError):
    def __init__(self, view: str, known: tuple[str, ...]):
        super().__init__(f"unknown view {view!r}: choose one of {', '.join(known)}")
        self.view = view


class WrongJob(ViewError):
    """A read named job `job` for view `view`, which job `owner` publishes: the view's keys are under the owner's
    generation, so the read would find nothing."""

    def __init__(self, view: str, job: str, owner: str):
        super().__init__(
            f"view {view!r} belongs to job {owner!r}, not {job!r}: name the view alone (its job is the pipeline's)"
        )
        self.view, self.job, self.owner = view, job, owner


class WrongViewKind(ViewError):
    """View `view` is a `kind` view where a `wanted` one is read (e.g. `views.list.read_list` of a row view)."""

    def __init__(self, view: str, kind: str, wanted: str):
        super().__init__(f"{view} is a {kind} view, not a {wanted}")
        self.view, self.kind, self.wanted = view, kind, wanted


class RedisCommandFailed(ViewError):
    """Redis answered a command of `what` (a sink, a script) with an error (`error`, Redis's reply)."""

    def __init__(self, what: str, error: str):
        super().__init__(f"{what}: a command failed in Redis: {error}")
        self.what, self.error = what, error


class Fenced(RedisCommandFailed):
    """Redis refused a write of `what`: it carried a lease epoch below the job's fence (`views.fence`), so another
    driver of the job holds the lease now. Nothing of the refused call was applied; this writer must stop."""
