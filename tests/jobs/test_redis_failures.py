"""Redis failures as a user meets them through the installed `mview`: a password-protected server that is
unreachable, refuses the credentials, or is addressed with TLS on one side only. Every error is one line that
says what is wrong and what to do, and no output or status shows the password. A deployed job that waits for
Redis or whose credentials stop working: tests/jobs/ops/test_deploy.py (it shares that module's deployment)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_settings
from tests.jobs.opshelp import OwnRedis, mview, one_line_error

JOB, SECRET = "timeline", "pw-S3cret"


def _protected(tmp_path) -> OwnRedis:
    own = OwnRedis(tmp_path / "redis")
    own.password = SECRET
    return own.start()


@pytest.mark.slow
def test_cli_errors_name_the_problem_and_never_show_the_password(tmp_path):
    own = _protected(tmp_path)
    settings = make_settings(tmp_path / "lake", own.url())
    settings.lake_dir.mkdir(parents=True)
    wrong, none = own.url().replace(SECRET, "wr0ng-pw"), own.url().replace(f":{SECRET}@", "")
    tls = own.url().replace("redis://", "rediss://")
    try:
        assert mview(settings, "query", JOB, "u1").returncode == 0
        for url, expected in [
            (wrong, ("refused the credentials", "redis://:***@127.0.0.1")),
            (none, ("requires a password", "redis://:PASSWORD@host:port/db")),
            (tls, ("TLS handshake", "use redis:// for a plain port", "rediss://:***@127.0.0.1")),
        ]:
            for args in (("query", JOB, "u1"), ("deploy", JOB)):
                line = one_line_error(mview(settings, *args, url=url), *expected)
                assert "make redis" not in line and "wr0ng" not in line and SECRET not in line
        assert not (settings.lake_dir / "jobs" / JOB / "job.log").exists()  # no deploy started anything

        own.stop()
        line = one_line_error(
            mview(settings, "query", JOB, "u1"), "cannot reach Redis at redis://:***@127.0.0.1", "make redis"
        )
        assert SECRET not in line
        for args in (("status", "--json"), ("status",)):
            r = mview(settings, *args)
            assert r.returncode == 0 and SECRET not in r.stdout + r.stderr, r
        status = json.loads(mview(settings, "status", "--json").stdout)
        assert status[JOB]["redis"].startswith("cannot reach Redis at redis://:***@127.0.0.1")
    finally:
        own.stop()
