"""`python -m jobs.dev.postgres [stop]`: a development PostgreSQL for the `cdc` job; `scratch_postgres` for tests.

`main` (`make postgres`): if a server answers at PG_DSN (default for the target
`host=127.0.0.1 port=5433 dbname=mview user=mview`), does nothing. Otherwise, if PG_DSN's host is local, starts
Debian's PostgreSQL 15 (`/usr/lib/postgresql/15/bin`, package `postgresql`) on 127.0.0.1 at PG_DSN's port with
`wal_level=logical`, data and log under `LAKE_DIR/postgres` (initdb if missing: the DSN's user is the
superuser, local connections are trusted), and creates the DSN's database. `main(["stop"])` (`make
postgres-stop`) stops the server `make postgres` started.

PostgreSQL refuses to run as root: run as root, initdb and pg_ctl run as the `postgres` system user (which the
package creates) through `runuser`, and the data directory is owned by it, so every directory above it must be
searchable by that user. Any failure is one line (`PostgresServerFailed`) naming what to do.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.core.settings import Settings
from jobs.dev.redis import free_port
from jobs.errors import PostgresServerFailed

__all__ = ["main", "scratch_postgres", "start_server", "stop_server", "DEV_DSN", "PG_BIN"]

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
DEV_DSN = "host=127.0.0.1 port=5433 dbname=mview user=mview"
_USER = "postgres"  # the system user the server runs as when we are root


def _as_server_user() -> list[str]:
    """The command prefix that runs a program as the server's user: nothing unless we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(_USER)
    except KeyError:
        raise PostgresServerFailed(
            f"PostgreSQL refuses to run as root and there is no {_USER!r} system user to run it as: "
            "apt-get install -y postgresql (which creates it)"
        ) from None
    return ["runuser", "-u", _USER, "--"]


def _exe(name: str) -> str:
    exe = PG_BIN / name
    if not exe.exists():
        raise PostgresServerFailed(
            f"PostgreSQL 15 is not installed ({exe} is missing): apt-get install -y postgresql"
        )
    return str(exe)


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(_as_server_user() + cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        who = f" as the {_USER!r} system user (PostgreSQL refuses root)" if os.geteuid() == 0 else ""
        raise PostgresServerFailed(f"{what}{who} failed: {last[0]}")


def _own(path: Path) -> None:
    """Make `path` (a directory we created) the server user's, and check it can reach it."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(path, 0o700)
        for parent in path.parents:
            if not os.stat(parent).st_mode & 0o001:
                raise PostgresServerFailed(
                    f"{parent} is not searchable by the {_USER!r} system user the server runs as (PostgreSQL "
                    f"refuses root): chmod o+x {parent}, or put LAKE_DIR elsewhere"
                )


def start_server(root: Path, port: int, *, user: str, fast: bool = False) -> float:
    """Start PostgreSQL with its data under `root/data` (initdb as superuser `user` if missing) on 127.0.0.1:`port`,
    `wal_level=logical`, socket and log in `root`. `fast` (tests): no fsync, and commit timestamps kept (a test
    reads the database's own history with `pg_xact_commit_timestamp`). Returns the seconds it took."""
    started = time.monotonic()
    root = Path(root).resolve()
    data = root / "data"
    _own(root)
    if not (data / "PG_VERSION").exists():
        _run(
            [_exe("initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"]
            + (["--no-sync"] if fast else []),
            "initdb",
        )
    opts = (
        f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c wal_level=logical"
        " -c max_wal_senders=10 -c max_replication_slots=10"
    )
    if fast:
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c track_commit_timestamp=on"
    log = root / "postgres.log"
    _run(
        [_exe("pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
        "pg_ctl start",
    )
    return time.monotonic() - started


def stop_server(root: Path) -> bool:
    """Stop the server whose data is under `root/data` (fast shutdown). False if it was not running."""
    data = Path(root).resolve() / "data"
    if not (data / "postmaster.pid").exists():
        return False
    _run([_exe("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], "pg_ctl stop")
    return True


def _connect(dsn: str, **over):
    import psycopg2

    return psycopg2.connect(dsn, connect_timeout=3, **over)


def _create_database(port: int, user: str, dbname: str) -> None:
    import psycopg2

    conn = _connect(f"host=127.0.0.1 port={port} user={user} dbname=postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {psycopg2.extensions.quote_ident(dbname, cur)}")
    finally:
        conn.close()


def scratch_postgres(user: str = "mview", dbname: str = "mview") -> tuple[Path, int, float]:
    """Start a throw-away server (no fsync) on a free port with database `dbname`, its files in a new directory
    under /tmp (the server's user must reach it; pytest's own tmp dirs are root-only). Returns (root, port,
    seconds to start); the caller stops it with `stop_server(root)` and removes `root`."""
    root = Path(tempfile.mkdtemp(prefix="mview-pg-", dir="/tmp"))
    os.chmod(root, 0o755)
    port = free_port()
    took = start_server(root / "pg", port, user=user, fast=True)
    _create_database(port, user, dbname)
    return root, port, took


def _dev(settings: Settings) -> tuple[dict, Path]:
    from psycopg2.extensions import parse_dsn

    dsn = settings.pg_dsn or DEV_DSN
    return parse_dsn(dsn), settings.lake_dir / "postgres"


def main(argv: list[str] | None = None) -> int:
    import psycopg2

    from changelog.errors import PgDsnInvalid

    argv = sys.argv[1:] if argv is None else argv
    settings = Settings.from_env()
    try:
        try:
            params, root = _dev(settings)
        except psycopg2.ProgrammingError as e:  # "invalid dsn: ...", which may quote the password
            print(f"make postgres: {PgDsnInvalid(str(e).strip(), settings.pg_dsn)}", file=sys.stderr)
            return 1
        if argv[:1] == ["stop"]:
            print("stopped PostgreSQL" if stop_server(root) else f"no PostgreSQL of ours runs from {root}")
            return 0
        shown = " ".join(f"{k}={v}" for k, v in params.items() if k != "password")
        try:
            _connect(settings.pg_dsn or DEV_DSN).close()
            print(f"PostgreSQL answers at {shown}")
            return 0
        except psycopg2.OperationalError:
            pass
        if params.get("host", "127.0.0.1") not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"nothing answers at PG_DSN ({shown}) and it is not local: start that server", file=sys.stderr
            )
            return 1
        port, user = int(params.get("port", 5432)), params.get("user", "mview")
        took = start_server(root, port, user=user)
        _create_database(port, user, params.get("dbname", user))
        print(f"started PostgreSQL at {shown} in {took:.1f}s (wal_level=logical; data and log in {root})")
        return 0
    except PostgresServerFailed as e:
        print(f"make postgres: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
