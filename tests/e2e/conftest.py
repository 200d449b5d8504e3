"""Headless Chromium for the end-to-end admin tests, driven by Selenium.

Debian's ``chromium`` and ``chromium-driver`` packages provide /usr/bin/chromium and
/usr/bin/chromedriver (.ci/apt-packages installs them); the tests skip with a reason when either,
or the selenium package, is missing. Screenshots go to ``WEFT_E2E_SCREENSHOTS`` (a directory, e.g.
docs/images to refresh the documentation's pictures) or to the test's tmp_path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("WEFT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("WEFT_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
    "--force-device-scale-factor=1",
    "--lang=en-US",
)


def _missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} is missing (apt-get install {package}; .ci/apt-packages lists it)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install 'selenium>=4.20,<5')"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="weft-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where screenshots are saved: $WEFT_E2E_SCREENSHOTS, else the test's tmp_path."""
    target = Path(os.environ.get("WEFT_E2E_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target
