"""A real headless Chromium for the dashboard tests: Debian's `chromium` + `chromium-driver`, driven by selenium.

`ensure_chromium()` installs them with apt-get when they are missing and apt is usable (root, apt-get on the
PATH), once per machine: installing twice is a no-op. Where that is impossible, the tests skip LOUDLY (a
warning and a skip reason naming what is missing); MEMENTO_REQUIRE_BROWSER=1 turns the skip into a failure.
Selenium is synchronous: the async tests call a Browser through `anyio.to_thread`, so the daemon they run
in-process keeps serving while the browser works.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

PACKAGES = ("chromium", "chromium-driver")
BINARIES = ("chromium", "chromedriver")


def _found() -> bool:
    return all(shutil.which(name) for name in BINARIES)


@functools.cache
def ensure_chromium() -> str | None:
    """None when chromium and chromedriver are on the PATH (installing them if it can), else why not."""
    if _found():
        return None
    if os.environ.get("MEMENTO_TEST_NO_APT") == "1":
        return "chromium/chromedriver missing and MEMENTO_TEST_NO_APT=1"
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return "chromium/chromedriver missing; install them with: apt-get install -y " + " ".join(PACKAGES)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-400:]}"
    return None if _found() else "apt-get installed " + " ".join(PACKAGES) + " but the binaries are not on the PATH"


def require_browser() -> None:
    """Skip (loudly) or fail when no headless Chromium can run here."""
    missing = ensure_chromium()
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing = missing or "selenium is not installed (pip install 'selenium>=4.20')"
    if missing is None:
        return
    message = f"NO BROWSER, dashboard tests NOT RUN: {missing}"
    if os.environ.get("MEMENTO_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    print(f"\n*** {message} ***", file=sys.stderr)
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


class Browser:
    """One headless Chromium window; every method is synchronous (call it through `run`)."""

    def __init__(self, width: int = 1440, height: int = 900) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    f"--window-size={width},{height}", "--force-device-scale-factor=1"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))

    def get(self, url: str) -> None:
        """Load a page."""
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body: use `return`) in the page."""
        return self.driver.execute_script(script, *args)

    def wait(self, script: str, *args: Any, timeout: float = 10.0) -> Any:
        """Poll `script` until it returns something truthy; fail the test with the script on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"browser condition not met within {timeout} s: {script}")
            time.sleep(0.03)

    def click(self, selector: str) -> None:
        """Click the first element matching a CSS selector."""
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, selector).click()

    def type(self, selector: str, text: str) -> None:
        """Type into the first element matching a CSS selector."""
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, selector).send_keys(text)

    def screenshot(self, path: Path) -> None:
        """Save the window as a PNG, only when MEMENTO_SCREENSHOTS=1: a test run leaves the docs' images alone."""
        if os.environ.get("MEMENTO_SCREENSHOTS") != "1":
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))

    def quit(self) -> None:
        """Close the browser."""
        self.driver.quit()


async def run(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a Browser method in a worker thread, so the in-process daemon keeps serving meanwhile."""
    return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


@contextmanager
def browser() -> Iterator[Browser]:
    """A Browser for one test, closed afterwards."""
    require_browser()
    opened = Browser()
    try:
        yield opened
    finally:
        opened.quit()
