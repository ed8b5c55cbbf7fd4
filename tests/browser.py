"""Headless Chromium for the page tests (Debian's `chromium` + `chromedriver`, via Selenium)."""

from __future__ import annotations

import shutil

import pytest


def browser(tmp_path):
    """A headless Chromium WebDriver with its profile under `tmp_path` (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver (.ci/run does it)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=900,1000",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)
