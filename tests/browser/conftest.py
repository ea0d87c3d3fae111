"""Fixtures for the browser tests: Debian's Chromium driven by Playwright's sync API
against the end-to-end harness's real server and `python -m agent` processes.

The server, the agents and the fleet come from tests/e2e (imported below, not
copied). Playwright's sync API marks its event loop as running on this thread
between its calls (playwright/_impl/_greenlets.py), so Django refuses ORM calls
(SynchronousOnlyOperation) while a browser is open: a test prepares the database
first, then opens the browser with `chromium()`, and from then on talks to the
server over HTTP only (the harness's Api), until the browser is closed.

Chromium or Playwright missing: the tests skip, or fail with
BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets), like the postgres and redis marks.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES
from tests.e2e.conftest import make_fleet, server, server_environ  # noqa: F401
from tests.e2e.harness import PROJECT_ROOT

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and nothing that reaches out to the network on its own.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
EXPECT_TIMEOUT_MS = 10_000  # an htmx swap or a live refetch; waits on agents say more
SCREENSHOTS_DIR = PROJECT_ROOT / "docs" / "screenshots"


def _browser_missing() -> list[str]:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python (pip install -r requirements-dev.txt)")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    return missing


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll answers and last-seen times live in the cache, which the server shares
    when it has Redis: every browser test starts and ends with it empty."""


@pytest.fixture
def chromium(tmp_path):
    """chromium() -> a context manager yielding a headless Chromium (Playwright's
    Browser). Open it after the database is prepared (see the module docstring).
    When the block raises, every open page is screenshotted into the test's tmp dir."""
    missing = _browser_missing()
    if missing:
        message = "needs " + " and ".join(missing)
        if REQUIRE_SERVICES:
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    @contextlib.contextmanager
    def launch():
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                 args=CHROMIUM_ARGS)
            try:
                yield browser
            except BaseException:
                pages = [p for c in browser.contexts for p in c.pages if not p.is_closed()]
                for index, page in enumerate(pages):
                    path = tmp_path / f"failure-{index}.png"
                    with contextlib.suppress(Exception):
                        page.screenshot(path=path, full_page=True)
                        print(f"page {page.url} at failure: {path}")
                raise
            finally:
                browser.close()

    return launch


@pytest.fixture
def screenshot(tmp_path):
    """screenshot(page, name): a full-page PNG into docs/screenshots/ when
    BELLWETHER_SCREENSHOTS=1 (to regenerate the committed ones), else into the
    test's tmp dir."""
    if os.environ.get("BELLWETHER_SCREENSHOTS") == "1":
        directory = SCREENSHOTS_DIR
    else:
        directory = tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = directory / f"{name}.png"
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        # Playwright hides the caret and stops animations with injected inline styles,
        # which the CSP refuses (and the tests would report as violations): the
        # focused element is blurred above instead.
        page.screenshot(path=path, full_page=True, animations="allow", caret="initial")
        return path

    return take
