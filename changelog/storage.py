"""The lake as one store: `LAKE_DIR` is a local path, `hdfs://host:port/path` or `s3a://bucket/path`.

Every file the service keeps in the lake (besides what Spark and delta-rs write themselves: Delta tables, streaming
checkpoints, Parquet state) goes through a `Lake`: small objects addressed by *keys*, `/`-separated paths relative
to the lake's root (`jobs/timeline/status.json`). The local disk is one backend among others:

| backend | library | `write` (replace) | `create` (if absent) |
|---|---|---|---|
| local | the OS | a temporary file, then `rename(2)` over the key | a temporary file, then `link(2)`, which fails if the key exists |
| HDFS | `hdfs-native` (the NameNode protocol, no JVM; the client delta-rs uses) | a temporary file, then a rename with overwrite | a temporary file, then a rename *without* overwrite, which the NameNode refuses atomically if the key exists |
| S3 | `obstore` (Rust's `object_store`, as delta-rs) | a PUT (an object is replaced whole) | a conditional PUT (`If-None-Match: *`), refused with 412 if the key exists |

So a reader sees an object's old or new content, never a part of it, and of several writers racing to `create` one
key exactly one wins, on every store: that is what locks, leases and once-only records build on (never a local
`flock`). Directories are implied by keys (`list` gives the immediate children of a prefix; on S3 an empty
"directory" does not exist).

Spark and delta-rs read the same lake by URI: `uri(key)` for Spark (`s3a://` on S3), `delta_uri(key)` and
`delta_options()` for delta-rs (`s3://` with the endpoint and credentials). S3's endpoint and credentials come from
`S3_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_REGION`; they are never part of a message.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import orjson

from changelog.errors import ChangelogError

__all__ = ["Lake", "Entry", "StorageError", "LakeUnreachable", "NotFound", "open_lake", "as_lake"]


class StorageError(ChangelogError):
    """A store refused or failed an operation: `key` and `reason` (one line, no credentials)."""

    def __init__(self, lake: str, key: str, reason: str):
        super().__init__(f"{lake}: {key}: {reason}")
        self.lake, self.key, self.reason = lake, key, reason


class LakeUnreachable(StorageError):
    """The store does not answer (a NameNode or S3 endpoint that is down): a job waits, a producer fails."""


class NotFound(StorageError):
    """No object at `key`."""


@dataclass(frozen=True)
class Entry:
    """A child of a prefix: `name` (the last part of its key), a directory (a prefix) or an object of `size`
    bytes modified at `mtime_ms` (0 when the store does not say, for a directory)."""

    name: str
    is_dir: bool
    size: int = 0
    mtime_ms: int = 0


_DOWN = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}


def _tmp_name(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex}.tmp"


def _mkdirs(path: Path, mode: int) -> None:
    """Make `path` and its missing parents with `mode` (an owner-only file's directories are owner-only too, 0700,
    whatever the umask of the process that writes first)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=mode)
        except FileExistsError:  # made meanwhile by another writer
            pass


class _Local:
    def __init__(self, root: Path):
        self.root = root

    def _p(self, key: str) -> Path:
        return self.root / key if key else self.root

    def read(self, key: str) -> bytes:
        return self._p(key).read_bytes()

    def _staged(self, key: str, data: bytes, mode: int) -> Path:
        p = self._p(key)
        _mkdirs(p.parent, 0o700 if not mode & 0o077 else 0o777)
        tmp = p.with_name(_tmp_name(p.name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except BaseException:  # a full disk: no temporary file left behind
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def write(self, key: str, data: bytes, mode: int) -> None:
        tmp = self._staged(key, data, mode)
        try:
            os.replace(tmp, self._p(key))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def create(self, key: str, data: bytes, mode: int) -> bool:
        tmp = self._staged(key, data, mode)
        try:
            os.link(tmp, self._p(key))
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str) -> list[Entry]:
        try:
            with os.scandir(self._p(prefix)) as it:
                out = []
                for e in it:
                    try:
                        if e.is_dir():
                            out.append(Entry(e.name, True))
                        else:
                            st = e.stat()
                            out.append(Entry(e.name, False, st.st_size, int(st.st_mtime * 1000)))
                    except FileNotFoundError:  # removed while listed (Spark's log clean-up, a rename)
                        continue
                return out
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, key: str) -> bool:
        return self._p(key).exists()

    def delete(self, key: str) -> None:
        self._p(key).unlink(missing_ok=True)

    def delete_tree(self, prefix: str) -> None:
        p = self._p(prefix)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# A NameNode that does not answer fails the call within a second (hdfs-native's defaults retry for three minutes):
# the caller decides how to wait (a deployed job retries with its backoff and says so in `status`; a producer exits).
_HDFS_CONFIG = {
    "dfs.client.failover.max.attempts": "1",
    "dfs.client.failover.sleep.base.millis": "100",
    "dfs.client.failover.sleep.max.millis": "500",
    "dfs.client.socket-timeout": "20000",
}


class _Hdfs:
    def __init__(self, url: str, root: str):
        from hdfs_native import Client

        self.client, self.root = Client(url, config=_HDFS_CONFIG), root.rstrip("/") or "/"

    def _p(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def read(self, key: str) -> bytes:
        with self.client.read(self._p(key)) as f:
            return f.read()

    def _staged(self, key: str, data: bytes) -> str:
        path = self._p(key)
        parent, _, name = path.rpartition("/")
        self.client.mkdirs(parent or "/", create_parent=True)
        tmp = f"{parent}/{_tmp_name(name)}"
        with self.client.create(tmp) as out:
            out.write(data)
        return tmp

    def write(self, key: str, data: bytes, mode: int) -> None:
        tmp = self._staged(key, data)
        try:
            self.client.rename(tmp, self._p(key), overwrite=True)
        except BaseException:
            self.client.delete(tmp)
            raise

    def create(self, key: str, data: bytes, mode: int) -> bool:
        tmp = self._staged(key, data)
        try:
            self.client.rename(tmp, self._p(key), overwrite=False)
            return True
        except FileExistsError:
            self.client.delete(tmp)
            return False
        except BaseException:
            self.client.delete(tmp)
            raise

    def list(self, prefix: str) -> list[Entry]:
        try:
            return [
                Entry(s.path.rstrip("/").rpartition("/")[2], s.isdir, s.length, s.modification_time)
                for s in self.client.list_status(self._p(prefix))
            ]
        except FileNotFoundError:
            return []

    def exists(self, key: str) -> bool:
        try:
            self.client.get_file_info(self._p(key))
            return True
        except FileNotFoundError:
            return False

    def delete(self, key: str) -> None:
        self.client.delete(self._p(key))

    def delete_tree(self, prefix: str) -> None:
        self.client.delete(self._p(prefix), recursive=True)


# The client's retries of one request (connection errors, 5xx, dropped connections): a short budget, so a store
# that does not answer fails a command within about a second (obstore's default is 10 retries over ~3 s); a job
# retries the whole operation with its own backoff.
_S3_RETRY = {
    "max_retries": 3,
    "retry_timeout": timedelta(seconds=1),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(milliseconds=400)},
}
_S3_CONNECT_TIMEOUT = "1s"


def _no_userinfo(url: str) -> str:
    """`url` without a `user:password@` part."""
    parsed = urlparse(url)
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def _down_cause(error: Exception) -> str:
    """Why a backend's request did not get an answer, in a few words, from its error."""
    text = str(error)
    if "kind: Connect" in text or "connection refused" in text.lower():
        return "cannot connect"
    if "kind: Timeout" in text or "timed out" in text.lower():
        return "timed out"
    return type(error).__name__


class _S3:
    def __init__(self, bucket: str, root: str, env: Mapping[str, str]):
        from obstore.store import S3Store

        self.root = root.strip("/")
        endpoint = env.get("S3_ENDPOINT", "").strip()
        config = {
            "access_key_id": env.get("AWS_ACCESS_KEY_ID", ""),
            "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY", ""),
            "region": env.get("AWS_REGION", "") or "us-east-1",
        }
        if endpoint:
            config.update(endpoint=endpoint, virtual_hosted_style_request=False)
        client = {"connect_timeout": _S3_CONNECT_TIMEOUT}
        if endpoint.startswith("http:"):
            client["allow_http"] = True
        self.store = S3Store(
            bucket,
            config={k: v for k, v in config.items() if v != ""},
            client_options=client,
            retry_config=_S3_RETRY,
        )
        self.where = f"the S3 endpoint {_no_userinfo(endpoint)}" if endpoint else f"S3 (bucket {bucket})"

    def _k(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def read(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, self._k(key)).bytes())

    def write(self, key: str, data: bytes, mode: int) -> None:
        import obstore

        obstore.put(self.store, self._k(key), data)

    def create(self, key: str, data: bytes, mode: int) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            obstore.put(self.store, self._k(key), data, mode="create")
            return True
        except (AlreadyExistsError, PreconditionError):
            return False

    def list(self, prefix: str) -> list[Entry]:
        import obstore

        base = self._k(prefix).rstrip("/")
        got = obstore.list_with_delimiter(self.store, f"{base}/" if base else None)
        out = [Entry(p.rstrip("/").rpartition("/")[2], True) for p in got["common_prefixes"]]
        for o in got["objects"]:
            modified = o.get("last_modified")
            ms = int(modified.timestamp() * 1000) if modified else 0
            out.append(Entry(o["path"].rpartition("/")[2], False, o["size"], ms))
        return out

    def exists(self, key: str) -> bool:
        import obstore

        try:
            obstore.head(self.store, self._k(key))
            return True
        except FileNotFoundError:
            return bool(self.list(key))  # a prefix with objects under it

    def delete(self, key: str) -> None:
        import obstore

        try:
            obstore.delete(self.store, self._k(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, prefix: str) -> None:
        import obstore

        base = self._k(prefix).rstrip("/")
        keys = [o["path"] for batch in obstore.list(self.store, f"{base}/") for o in batch]
        for i in range(0, len(keys), 1000):
            obstore.delete(self.store, keys[i : i + 1000])
        self.delete(prefix)


def _key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class Lake:
    """The lake at `LAKE_DIR` (`open_lake`): its objects by key, and its URIs for Spark and delta-rs."""

    def __init__(self, text: str, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.text = text
        parsed = urlparse(text)
        scheme = parsed.scheme.lower() if "://" in text else ""
        if scheme in ("", "file"):
            self.kind, self.root = "local", str(Path(parsed.path if scheme else text).expanduser().resolve())
            self._store = _Local(Path(self.root))
        elif scheme == "hdfs":
            self.kind, self.netloc, self.root = "hdfs", parsed.netloc, parsed.path.rstrip("/")
            self._store = _Hdfs(f"hdfs://{parsed.netloc}", self.root)
        elif scheme in ("s3a", "s3"):
            self.kind, self.bucket, self.root = "s3", parsed.netloc, parsed.path.strip("/")
            self._env = {
                k: env.get(k, "")
                for k in ("S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
            }
            self._store = _S3(self.bucket, self.root, self._env)
        else:
            raise StorageError(
                text,
                "",
                f"LAKE_DIR must be a local path, hdfs://host:port/path or s3a://bucket/path, not {scheme}://",
            )

    def __repr__(self) -> str:
        return f"Lake({self.uri()!r})"

    @property
    def where(self) -> str:
        """The store in messages: `the S3 endpoint URL` (no credentials), `the HDFS NameNode host:port`, `the local
        file system`."""
        if self.kind == "s3":
            return self._store.where
        return f"the HDFS NameNode {self.netloc}" if self.kind == "hdfs" else "the local file system"

    @property
    def start_hint(self) -> str:
        """What to do when the store does not answer."""
        if self.kind == "s3":
            return "start it, or check S3_ENDPOINT and LAKE_DIR"
        if self.kind == "hdfs":
            return "start it (`make hdfs` for the development one), or check LAKE_DIR"
        return "check LAKE_DIR"

    # --- URIs -------------------------------------------------------------------------------------------------
    def uri(self, *key: str) -> str:
        """What Spark reads and writes: a local path, `hdfs://...` or `s3a://...`."""
        k = _key(*key)
        if self.kind == "local":
            return str(Path(self.root, k)) if k else self.root
        if self.kind == "hdfs":
            return f"hdfs://{self.netloc}/{_key(self.root, k)}"
        return f"s3a://{self.bucket}/{_key(self.root, k)}"

    def delta_uri(self, *key: str) -> str:
        """What delta-rs reads and writes (`s3://` for an S3 lake), with `delta_options()`."""
        u = self.uri(*key)
        return "s3://" + u[len("s3a://") :] if self.kind == "s3" else u

    def delta_options(self) -> dict[str, str]:
        """delta-rs's storage options: for S3 the endpoint, credentials, plain HTTP when the endpoint is, and
        commits by conditional PUT (delta-rs's default; safe with concurrent writers)."""
        if self.kind != "s3":
            return {}
        e = self._env
        opts = {
            "AWS_ACCESS_KEY_ID": e["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": e["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": e["AWS_REGION"] or "us-east-1",
            "conditional_put": "etag",
        }
        if e["S3_ENDPOINT"]:
            opts.update(AWS_ENDPOINT_URL=e["S3_ENDPOINT"], AWS_S3_ADDRESSING_STYLE="path")
            if e["S3_ENDPOINT"].startswith("http:"):
                opts["AWS_ALLOW_HTTP"] = "true"
        return {k: v for k, v in opts.items() if v}

    def local_path(self, *key: str) -> Path | None:
        """The key's path on this machine's disk for a local lake, else None."""
        return Path(self.uri(*key)) if self.kind == "local" else None

    # --- objects ----------------------------------------------------------------------------------------------
    def _call(self, what: str, key: str, fn, *args):
        try:
            return fn(*args)
        except FileNotFoundError:
            raise NotFound(self.uri(), key, "no such object") from None
        except (ConnectionError, TimeoutError) as e:
            raise LakeUnreachable(self.uri(), key, f"{what}: {self.where} does not answer ({e})") from None
        except OSError as e:
            text = str(e.strerror or e)
            if e.errno in _DOWN or any(
                w in text.lower() for w in ("connection refused", "timed out", "unreachable")
            ):
                raise LakeUnreachable(
                    self.uri(), key, f"{what}: {self.where} does not answer ({text})"
                ) from None
            raise StorageError(self.uri(), key, f"{what}: {text}") from None
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001 - a backend's own error type: one line naming the key
            name = type(e).__name__
            if any(w in name for w in ("Connect", "Timeout", "Unavailable")) or "connect" in str(e).lower():
                raise LakeUnreachable(
                    self.uri(), key, f"{what}: {self.where} does not answer ({_down_cause(e)})"
                ) from None
            raise StorageError(self.uri(), key, f"{what}: {name}: {str(e).splitlines()[0][:300]}") from None

    def read_bytes(self, *key: str) -> bytes:
        k = _key(*key)
        return self._call("read", k, self._store.read, k)

    def write_bytes(self, data: bytes, *key: str, mode: int = 0o600) -> None:
        """Replace the object at `key` with `data`, whole (readers see the old or the new content)."""
        k = _key(*key)
        self._call("write", k, self._store.write, k, data, mode)

    def create(self, data: bytes, *key: str, mode: int = 0o600) -> bool:
        """Create the object at `key` with `data` if there is none; True if this call created it (of several
        racing, exactly one), False if it existed."""
        k = _key(*key)
        return self._call("create", k, self._store.create, k, data, mode)

    def list(self, *prefix: str) -> list[Entry]:
        """The immediate children of `prefix` (none when it does not exist), sorted by name."""
        k = _key(*prefix)
        return sorted(self._call("list", k, self._store.list, k), key=lambda e: e.name)

    def exists(self, *key: str) -> bool:
        k = _key(*key)
        return self._call("exists", k, self._store.exists, k)

    def delete(self, *key: str) -> None:
        k = _key(*key)
        self._call("delete", k, self._store.delete, k)

    def delete_tree(self, *prefix: str) -> None:
        """Remove `prefix` and everything under it (nothing when it does not exist)."""
        k = _key(*prefix)
        if not k:
            raise StorageError(self.uri(), k, "refusing to delete the whole lake")
        self._call("delete", k, self._store.delete_tree, k)

    def tree_bytes(self, *prefix: str) -> int:
        """Bytes of the objects under `prefix`."""
        total = 0
        for e in self.list(*prefix):
            total += self.tree_bytes(*prefix, e.name) if e.is_dir else e.size
        return total

    def read_json(self, *key: str, default=None):
        """The JSON object at `key`, or `default` when there is none."""
        try:
            return orjson.loads(self.read_bytes(*key))
        except NotFound:
            return default

    def write_json(self, obj, *key: str, mode: int = 0o600) -> None:
        self.write_bytes(orjson.dumps(obj), *key, mode=mode)


def open_lake(text: str | os.PathLike, env: Mapping[str, str] | None = None) -> Lake:
    """The `Lake` of `LAKE_DIR`'s value `text` (a local path, `hdfs://host:port/path`, `s3a://bucket/path`)."""
    return Lake(str(text), env)


@functools.lru_cache(maxsize=64)
def _opened(text: str) -> Lake:
    return open_lake(text)


def as_lake(lake: Lake | str | os.PathLike) -> Lake:
    """`lake` itself, or the `Lake` at a path or URI (one per process and text among the 64 used last, credentials
    from the environment): for the edges that hold a local `Path` or a URI (dev launchers, tests); every function
    of the service takes a `Lake` (a job or command has the settings' `lake`)."""
    if isinstance(lake, Lake):
        return lake
    if lake is None:  # a caller's `settings.lake_dir` on a lake that is not local: never `./None`
        raise TypeError("as_lake(None): pass settings.lake (LAKE_DIR is not a local path)")
    return _opened(str(lake))
