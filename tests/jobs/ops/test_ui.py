"""The operations page with no job running: it says so, shows every job as not running, and its status endpoint
is `mview status --json` plus the page's fields; `mview ui` answers only its own address in the Host header.
(A running job on the page: tests/jobs/core/test_metrics.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request

from jobs.core.registry import jobs
from jobs.core.settings import Settings
from jobs.dev.redis import free_port
from jobs.ops.deploy import settings_env
from jobs.ops.ui import serve_in_thread
from tests.browser import browser
from tests.conftest import make_settings
from tests.jobs.ops.test_httpd import assert_refuses_other_hosts
from tests.jobs.opshelp import MVIEW, wait_for

JOBS = jobs(Settings.from_env({}))  # the built-in pipeline's jobs


def test_the_page_says_when_no_job_runs(tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url)
    settings.lake_dir.mkdir(parents=True)
    page = serve_in_thread(settings, page_url="http://127.0.0.1:8765/")
    try:
        body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{page.server_port}/api/status").read())
        assert body["running"] == 0 and set(body["jobs"]) == set(JOBS)
        assert all(row["metrics"] is None and row["metrics_url"] is None for row in body["jobs"].values())
        web = browser(tmp_path)
        try:
            web.get(f"http://127.0.0.1:{page.server_port}/")
            wait_for(
                lambda: "no job is running" in web.find_element("id", "note").text, "the page", timeout_s=60
            )
            cards = web.find_elements("css selector", ".job")
            assert [c.get_attribute("id") for c in cards] == [f"job-{j}" for j in JOBS]
            assert all(c.get_attribute("class") == "job stopped" for c in cards)
            link = web.find_element("id", "page-link").get_attribute("href")
            assert link == "http://127.0.0.1:8765/"
        finally:
            web.quit()
    finally:
        page.shutdown()


def test_mview_ui_refuses_a_foreign_host_header(tmp_path, redis_url):
    """DNS rebinding: a page of evil.example that resolves its name to 127.0.0.1 would read `/api/status` (every
    job's state, errors and URLs); `mview ui` answers it 421 and its own address 200."""
    settings = make_settings(tmp_path / "lake", redis_url)
    settings.lake_dir.mkdir(parents=True)
    port = free_port()
    env = {**os.environ, **settings_env(settings)}
    proc = subprocess.Popen([MVIEW, "ui", "--port", str(port)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"operations page at http://127.0.0.1:{port}/")
        assert json.loads(assert_refuses_other_hosts(port, "/api/status"))["running"] == 0
        assert b"<html" in assert_refuses_other_hosts(port, "/").lower()
    finally:
        proc.terminate()
        proc.wait(10)
