"""The live timeline page end to end in headless Chromium (Debian's `chromium` + `chromedriver`, via Selenium):
a new tweet by a followed user appears on the open page without a reload, and a tweet by someone not followed
does not; the page's server answers only its own address in the Host header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import orjson

from changelog.ingest import ingest
from jobs.dev.redis import free_port
from tests.browser import browser as _browser
from tests.builtin import run_timeline
from tests.conftest import make_settings
from tests.jobs.ops.test_httpd import assert_refuses_other_hosts
from timeline_demo.web import serve_in_thread


def _ingest(spark, settings, tmp_path, topic, records, name):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    ingest(spark, settings.lake, settings.topic(topic), [str(path)])


def post(tid: str, uid: str, ts: int) -> dict:
    return {"op": "post", "tweet_id": tid, "user_id": uid, "text": f"{tid} by {uid}", "ts": ts}


def _shown(browser) -> list[str]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline li')).map(li => li.dataset.tweetId)"
    )


def _wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    return cond()


def test_new_tweet_by_followed_user_appears_without_reload(spark, tmp_path, redis_url):
    settings = make_settings(tmp_path / "lake", redis_url)
    _ingest(
        spark,
        settings,
        tmp_path,
        "follows",
        [{"op": "follow", "follower_id": "r", "followee_id": "a", "ts": 1}],
        "f0",
    )
    _ingest(spark, settings, tmp_path, "tweets", [post("t1", "a", 10), post("t2", "b", 11)], "t0")
    run_timeline(spark, settings, once=True)

    server = serve_in_thread(redis_url)
    browser = _browser(tmp_path)
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/?user=r")
        assert _wait_for(lambda: _shown(browser) == ["t1"]), _shown(browser)
        browser.execute_script("window.__sameDocument = 'yes'")

        _ingest(spark, settings, tmp_path, "tweets", [post("t3", "a", 20), post("t4", "b", 21)], "t1")
        run_timeline(spark, settings, once=True)

        assert _wait_for(lambda: _shown(browser) == ["t3", "t1"]), _shown(browser)
        assert browser.execute_script("return window.__sameDocument") == "yes"  # no reload happened
        # read the list in one script: the page re-renders it every poll, so element handles go stale
        items = browser.execute_script(
            "return Array.from(document.querySelectorAll('#timeline li'))"
            ".map(li => [li.dataset.tweetId, li.dataset.arrived || null, li.textContent])"
        )
        assert "@a" in items[0][2] and "t3 by a" in items[0][2]
        # only the arrival is marked (and highlighted for a while) as come in live
        assert [(i[0], i[1]) for i in items] == [("t3", "live"), ("t1", None)]
        status = browser.find_element("id", "status").text
        assert "@r: 2 tweets shown" in status
    finally:
        browser.quit()
        server.shutdown()


def test_the_page_refuses_a_foreign_host_header(redis_url):
    """DNS rebinding: a page of evil.example that resolves its name to 127.0.0.1 would read any user's timeline;
    `python -m timeline_demo.web` (`make demo-web`) answers it 421 and its own address 200."""
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url}
    cmd = [sys.executable, "-m", "timeline_demo.web", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"timeline page at http://127.0.0.1:{port}/")
        body = json.loads(assert_refuses_other_hosts(port, "/api/timeline?user=u1"))
        assert body["user_id"] == "u1" and body["tweets"] == []
        assert b"<html" in assert_refuses_other_hosts(port, "/?user=u1").lower()
    finally:
        proc.terminate()
        proc.wait(10)
