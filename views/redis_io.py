"""Connecting to Redis (one server or a Redis Cluster), forwarding the sinks' commands, and the generation pointer:
one place for all three, used by sinks and readers.

A Redis Cluster is recognised by the server itself (`INFO cluster`: `cluster_enabled:1`, asked once per process and
URL): `connect` then returns a cluster client that routes every command to the master of its key's hash slot and
reads the cluster's layout from the node at the URL. Every key of one entity carries the entity's hash tag
(`views.keys`), so every script of the views touches one slot (with the fence key of that slot, `views.fence`); the job-level keys (`mv:gen:<job>`,
`mv:meta:<job>:<g>`) are only ever used one key per command, so they need no tag. `Forwarder` sends the sinks'
wire-protocol commands, grouped per master on a cluster.

Connection failures are classified (`classify`): a server that does not answer is `RedisUnavailable` (jobs
wait for it); credentials it refuses (`RedisAuthFailed`) and TLS on one side only (`RedisTLSMismatch`) are
`RedisMisconfigured`, permanent: nothing waits for them. Every message shows the URL without its password.
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError, TryAgainError
from redis.retry import Retry

from views.errors import (
    Fenced,
    RedisAuthFailed,
    RedisCommandFailed,
    RedisMisconfigured,
    RedisNotCluster,
    RedisTLSMismatch,
    RedisUnavailable,
    ViewError,
    redact,
    redact_url,
)
from views.keys import gen_key

__all__ = [
    "connect",
    "sink_client",
    "is_cluster",
    "quick_client",
    "watch_client",
    "probe",
    "classify",
    "redact_url",
    "STOP",
    "TLS_HANDSHAKE_S",
    "current_generation",
    "ensure_generation",
    "set_generation",
    "send_packed",
    "pack",
    "Forwarder",
    "WaitingRetry",
]

# Set when this process is stopping (a deployed job's SIGTERM: `jobs.core.runtime.STOP` is this event): a
# `WaitingRetry` then stops waiting and raises `RedisUnavailable`.
STOP = threading.Event()

# A TLS server answers a ClientHello at once; a plain Redis port never does. Longer than this: not TLS.
TLS_HANDSHAKE_S = 2.0

# Errors that pass: nothing answers, or a Redis Cluster is down, moving slots or without a master for a slot.
_TRANSIENT = (
    redis.ConnectionError,
    redis.TimeoutError,
    socket.timeout,
    ConnectionRefusedError,
    ClusterError,
    TryAgainError,
    SlotNotCoveredError,
)
# Replies of a cluster node that mean "not here, not now": the layout changed or the cluster is not ok yet.
_CLUSTER_REPLIES = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


class _TLSConnection(redis.SSLConnection):
    """An SSL connection whose handshake gives up after TLS_HANDSHAKE_S (a plain port never answers it)."""

    def _wrap_socket_with_ssl(self, sock):
        sock.settimeout(TLS_HANDSHAKE_S)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)
        except TimeoutError as e:
            raise ssl.SSLError(f"no TLS handshake answer within {TLS_HANDSHAKE_S:g} s") from e
        wrapped.settimeout(self.socket_timeout)
        return wrapped


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _speaks_tls(url: str) -> bool:
    """Whether the server of a redis:// `url` completes a TLS handshake (it reset a plain connection)."""
    try:
        pool = redis.ConnectionPool.from_url(url)
        host, port = pool.connection_kwargs.get("host"), pool.connection_kwargs.get("port", 6379)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection((host, port), timeout=TLS_HANDSHAKE_S) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ValueError):
        return False


def classify(url: str, error: BaseException) -> ViewError:
    """The error to report for a failure to talk to Redis at `url`: `RedisAuthFailed` or `RedisTLSMismatch`
    (permanent) or `RedisUnavailable` (possibly temporary). The messages show `url` redacted."""
    if isinstance(error, ViewError):
        return error
    chain = list(_chain(error))
    if any(isinstance(e, ssl.SSLError) for e in chain):
        tls = next(e for e in chain if isinstance(e, ssl.SSLError))
        return RedisTLSMismatch(url, tls.args[0] if len(tls.args) == 1 else tls)
    text = " ".join(str(e) for e in chain)
    if isinstance(error, redis.AuthenticationError) or any(
        word in text for word in ("NOAUTH", "WRONGPASS", "invalid username-password", "must be called with")
    ):
        return RedisAuthFailed(url, error)
    plain = not str(url).lower().startswith(("rediss://", "unix://"))
    reset = any(isinstance(e, (ConnectionResetError, BrokenPipeError)) for e in chain) or (
        "Connection closed by server" in text
    )
    if plain and reset and _speaks_tls(url):
        return RedisTLSMismatch(url, error)
    return RedisUnavailable(url, error)


class WaitingRetry(Retry):
    """Retry on connection errors with exponential backoff (0.1 s doubling to 5 s), logging
    `waiting for Redis at URL (attempt n): error` (URL redacted) to stderr (the job's log) at each failed
    attempt, until Redis answers or `STOP` is set (then `RedisUnavailable`). Permanent errors (refused
    credentials, TLS mismatch: `RedisMisconfigured`) are raised at once, never retried.

    Every command and pipeline of a client built with it blocks while Redis is unreachable and goes on when
    it returns. Sinks may therefore simply repeat a write: every sink write is idempotent or fenced.
    """

    def __init__(self, url: str):
        super().__init__(ExponentialBackoff(cap=5.0, base=0.1), -1, _TRANSIENT)
        self.url = url

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        self._backoff.reset()
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                fail(error, failures) if with_failure_count else fail(error)
                problem = classify(self.url, error)
                if isinstance(problem, RedisMisconfigured):
                    raise problem from None
                if STOP.is_set():
                    raise RedisUnavailable(
                        self.url, f"{error}; not waiting: this process is stopping"
                    ) from None
                print(
                    f"[{time.strftime('%H:%M:%S')}] waiting for Redis at {redact_url(self.url)} "
                    f"(attempt {failures}): {redact(error, self.url)}",
                    file=sys.stderr,
                    flush=True,
                )
                STOP.wait(self._backoff.compute(failures))


def _options(url: str) -> dict:
    return {"connection_class": _TLSConnection} if str(url).lower().startswith("rediss://") else {}


_MODES: dict[str, bool] = {}  # URL -> whether its server is a Redis Cluster node


def is_cluster(url: str, client: redis.Redis | None = None) -> bool:
    """Whether the server at `url` is a Redis Cluster node (`INFO cluster`), asked once per process and URL
    (through `client`, a plain client of that server, when given; else waiting for the server, `WaitingRetry`)."""
    if url not in _MODES:
        client = client or redis.Redis.from_url(
            url, socket_connect_timeout=3, retry=WaitingRetry(url), **_options(url)
        )
        info = client.info("cluster")
        _MODES[url] = bool(info.get("cluster_enabled"))
    return _MODES[url]


class _Cluster(RedisCluster):
    """A cluster client whose commands wait like `WaitingRetry` (`waiting`, None: they fail after redis-py's own
    few retries). Pipelines (`pipeline()`) do not wait: callers that need it repeat the whole pipeline."""

    waiting: WaitingRetry | None = None

    def execute_command(self, *args, **kwargs):
        if self.waiting is None:
            return super().execute_command(*args, **kwargs)
        return self.waiting.call_with_retry(
            lambda: super(_Cluster, self).execute_command(*args, **kwargs), _no_op
        )


def _no_op(*_args) -> None:
    return None


def _cluster_client(url: str, waiting: WaitingRetry | None, **options) -> _Cluster:
    """A cluster client that learnt the layout from the node at `url` (waiting for it with `waiting`)."""

    def build() -> _Cluster:
        try:
            client = _Cluster.from_url(url, **options)
        except RedisClusterException as e:  # no node of the layout answered
            raise redis.ConnectionError(str(e)) from e
        client.waiting = waiting
        return client

    return waiting.call_with_retry(build, _no_op) if waiting is not None else build()


def connect(url: str, *, check: bool = True, wait: bool = True, cluster: bool | None = None):
    """A client for `url`: a `redis.Redis`, or a Redis Cluster client when the server is a cluster node
    (`is_cluster`). `cluster=True` (REDIS_CLUSTER=true) requires a cluster node (else `RedisNotCluster`).

    wait=True (jobs and sinks): every command waits for an unreachable Redis (or a cluster that is down) and
    retries with backoff until it answers or the process stops, saying so on stderr (`WaitingRetry`); `check`
    then waits until Redis answers. wait=False (interactive reads): raises at once if Redis cannot be used. Either
    way a permanent problem raises `RedisAuthFailed`, `RedisTLSMismatch` or `RedisNotCluster` at once (one line,
    saying what to do).
    """
    common = {"socket_connect_timeout": 3, "socket_keepalive": True}
    waiting = WaitingRetry(url) if wait else None
    plain = redis.Redis.from_url(url, retry=waiting, **common, **_options(url))
    try:
        clustered = is_cluster(url, plain)
        if cluster and not clustered:
            raise RedisNotCluster(url)
        client = _cluster_client(url, waiting, **common) if clustered else plain
        if check:
            client.ping()
    except redis.ResponseError as e:
        if "SELECT is not allowed in cluster mode" not in str(e):
            raise
        raise RedisMisconfigured(
            f"{redact_url(url)} is a Redis Cluster node and a cluster has only database 0: end REDIS_URL with /0",
            url,
        ) from None
    except (redis.ConnectionError, redis.TimeoutError, OSError, RedisClusterException) as e:
        raise classify(url, e) from None
    return client


_SINK_CLIENTS: dict[str, redis.Redis] = {}


def sink_client(url: str):
    """`connect(url)` made once per process and URL and kept: the client the sinks' partitions share (in an
    executor's Python worker, from one micro-batch to the next), its connections reused."""
    if url not in _SINK_CLIENTS:
        _SINK_CLIENTS[url] = connect(url)
    return _SINK_CLIENTS[url]


def quick_client(url: str) -> redis.Redis:
    """A client of the server at `url` that fails at once (no retry, 1 s to connect, 2 s per reply): for
    watchers and probes. On a Redis Cluster it talks to that one node."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2, retry=None, **_options(url))


def watch_client(url: str, *, cluster: bool | None = None):
    """A client for a thread that watches Redis (a deployed job's guard): like `connect(url, wait=False,
    check=False, cluster=cluster)`, a Redis Cluster client when the server is a cluster node (every key read on the
    master of its slot), but it never waits and never hangs: 1 s to connect, 2 s per reply, no waiting retry (a
    cluster client only makes redis-py's few attempts after reading the layout again). Raises at once what
    `connect` raises (`RedisUnavailable` when nothing answers). The caller retries on any error, with a new client:
    a cluster's layout is read again when it is built."""
    common = {"socket_connect_timeout": 1, "socket_timeout": 2}
    plain = redis.Redis.from_url(url, retry=None, **common, **_options(url))
    try:
        clustered = is_cluster(url, plain)
        if cluster and not clustered:
            raise RedisNotCluster(url)
        return _cluster_client(url, None, **common) if clustered else plain
    except (redis.ConnectionError, redis.TimeoutError, OSError, RedisClusterException) as e:
        raise classify(url, e) from None


def probe(url: str, client: redis.Redis | None = None) -> ViewError | None:
    """None if Redis at `url` answers a PING now (and, for a Redis Cluster node, reports `cluster_state:ok`:
    every slot has a master that answers), else what is wrong (`classify`). Never waits."""
    try:
        client = client or quick_client(url)
        client.ping()
        if is_cluster(url, client):
            state = client.execute_command("CLUSTER", "INFO")
            if b"cluster_state:ok" not in state:
                return RedisUnavailable(url, "the Redis Cluster is down (cluster_state:fail)")
        return None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        return classify(url, e)


def current_generation(client: redis.Redis, job: str) -> int:
    """The job's serving generation, 0 if the job never published."""
    value = client.get(gen_key(job))
    return int(value) if value is not None else 0


def ensure_generation(client: redis.Redis, job: str) -> int:
    """The serving generation, set to 1 on first use (atomically: SET NX).

    A missing pointer means "never published" only if Redis kept its data: jobs call it only after
    `jobs.core.generations.serving_copy_lost` found nothing lost (via `jobs.core.replay.serving_or_rebuild`), so a Redis
    that lost the pointer gets a rebuilt generation, not an empty generation 1."""
    client.set(gen_key(job), 1, nx=True)
    return current_generation(client, job)


def set_generation(client: redis.Redis, job: str, generation: int) -> None:
    client.set(gen_key(job), generation)


def _failure(reply):
    """The first error in a reply (an error inside a MULTI/EXEC reply counts), or None."""
    if isinstance(reply, Exception):
        return reply
    if isinstance(reply, list):
        return next((x for x in reply if isinstance(x, Exception)), None)
    return None


def pack(*args) -> bytes:
    """One command in the wire protocol (RESP): `args` as bulk strings (str UTF-8 encoded, numbers as text)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _exchange(client: redis.Redis, payload: bytes, n: int, scripts: tuple[str, ...], what: str) -> int:
    """One attempt of `send_packed`; returns the sum of the integer replies. A reply that says the cluster layout
    changed or the cluster is not ok (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) raises `ClusterError` (transient)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        for script in scripts:
            conn.send_command("SCRIPT", "LOAD", script)
        conn.send_packed_command([payload], check_health=False)
        for _ in scripts:
            conn.read_response()
        error, ints = None, 0
        for _ in range(n):
            try:
                reply = conn.read_response()
            except redis.ResponseError as e:
                reply = e
            ints += reply if isinstance(reply, int) else 0
            error = error or _failure(reply)
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    if error is not None:
        text = str(error)
        if text.startswith("FENCED"):
            raise Fenced(what, text)
        if text.startswith(_CLUSTER_REPLIES) or type(error).__name__ in ("MovedError", "AskError"):
            raise ClusterError(f"{what}: {text}")
        raise RedisCommandFailed(what, text)
    return ints


def send_packed(
    client: redis.Redis, payload: bytes, n: int, *, scripts: tuple[str, ...] = (), what: str
) -> int:
    """Send `payload` (`n` commands already in the wire protocol) pipelined to one server and read its `n`
    replies, after loading `scripts` (a restarted Redis has none); returns the sum of the integer replies. Raises
    RedisCommandFailed naming `what` and the first error any command returned (every reply is read first, so the
    connection stays usable). Retried as a whole on a connection error (`WaitingRetry`): callers send only
    idempotent or fenced commands, so a repeat is harmless."""
    return client.get_retry().call_with_retry(lambda: _exchange(client, payload, n, scripts, what), _no_op)


# The fence key every fenced call names as its KEYS[1] (`views.fence`) ends with this hash tag: on one server it is
# the key itself; on a Redis Cluster `fence_in_slot` puts the tag of the call's own hash slot in its place.
FENCE_ANY_SLOT = "{?}"
_PLACEHOLDER = b":" + FENCE_ANY_SLOT.encode() + b"\r\n"
_SLOT_TAGS: list[bytes] = []


def slot_tag(slot: int) -> bytes:
    """A short hash tag (decimal digits) whose keys a Redis Cluster places in hash slot `slot` (all 16384 found
    once per process, about 0.3 s)."""
    if not _SLOT_TAGS:
        tags: list[bytes | None] = [None] * 16384
        left, i = 16384, 0
        while left:
            text = str(i).encode()
            s = key_slot(text)
            if tags[s] is None:
                tags[s], left = text, left - 1
            i += 1
        _SLOT_TAGS[:] = tags
    return _SLOT_TAGS[slot]


def fence_in_slot(payload: bytes, slot: int) -> bytes:
    """`payload` (one command) with its fence key `...:{?}` (within its first 1 KiB), if it has one, made the fence
    key of hash slot `slot`: `...:{<slot_tag(slot)>}`."""
    at = payload.find(_PLACEHOLDER, 0, 1024)
    if at < 0:
        return payload
    start = payload.rfind(b"$", 0, at)
    name = payload[payload.index(b"\r\n", start) + 2 : at]
    key = b"%s:{%s}" % (name, slot_tag(slot))
    return b"%s$%d\r\n%s\r\n%s" % (payload[:start], len(key), key, payload[at + len(_PLACEHOLDER) :])


class Forwarder:
    """Forwards commands already in the wire protocol, pipelined, about `limit` bytes per round trip, to one
    server; on a Redis Cluster, to the master of each payload's hash slot (one pipeline per master), so one
    payload (`add`) must touch the keys of one slot only (`key` names one of them, or its hash tag).

    Commands of one key keep their order. Every payload must be idempotent or fenced: after a lost connection,
    or a cluster reply that the layout changed or the cluster is down (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), the
    payloads not yet acknowledged are sent again, after the layout is read anew, waiting with backoff while
    Redis does not answer (`WaitingRetry`). `ints` is the sum of the integer replies (fenced calls that applied).
    Use as a context manager, or call `flush()` at the end."""

    def __init__(self, client, *, what: str, scripts: tuple[str, ...] = (), limit: int = 1 << 20):
        self.client, self.what, self.scripts, self.limit = client, what, scripts, limit
        self.cluster = isinstance(client, RedisCluster)
        self.ints = 0
        self._pending: dict[str, list[tuple[int, bytes, int]]] = {}
        self._sizes: dict[str, int] = {}

    def add(self, payload: bytes, replies: int, key: str | bytes | None = None) -> None:
        """Queue `payload` (`replies` commands); sent once about `limit` bytes wait for the same server."""
        slot = key_slot(key.encode() if isinstance(key, str) else key) if self.cluster else 0
        if self.cluster:
            payload = fence_in_slot(payload, slot)
        node = self._node(slot)
        self._pending.setdefault(node, []).append((slot, payload, replies))
        self._sizes[node] = self._sizes.get(node, 0) + len(payload)
        if self._sizes[node] >= self.limit:
            self._send(self._take(node))

    def flush(self) -> None:
        for node in list(self._pending):
            self._send(self._take(node))

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        if kind is None:
            self.flush()

    def _node(self, slot: int) -> str:
        return self.client.nodes_manager.get_node_from_slot(slot).name if self.cluster else ""

    def _take(self, node: str) -> list[tuple[int, bytes, int]]:
        self._sizes.pop(node, None)
        return self._pending.pop(node, [])

    def _send(self, entries: list[tuple[int, bytes, int]]) -> None:
        if not self.cluster:
            self.ints += send_packed(
                self.client, b"".join(p for _, p, _ in entries), sum(n for *_, n in entries),
                scripts=self.scripts, what=self.what,
            )  # fmt: skip
            return
        left = list(entries)

        def attempt():
            groups: dict[str, list] = {}
            for e in left:
                groups.setdefault(self._node(e[0]), []).append(e)
            for name in list(groups):
                group = groups.pop(name)
                server = self.client.get_node(node_name=name).redis_connection
                payload, n = b"".join(p for _, p, _ in group), sum(k for *_, k in group)
                self.ints += _exchange(server, payload, n, self.scripts, self.what)
                left[:] = [e for g in groups.values() for e in g]

        def relayout(_error):
            try:
                self.client.nodes_manager.initialize()
            except (RedisClusterException, *_TRANSIENT):
                pass  # read again at the next attempt

        if self.client.waiting is None:
            return attempt()
        self.client.waiting.call_with_retry(attempt, relayout)
