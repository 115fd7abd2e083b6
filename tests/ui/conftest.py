"""A real browser for the UI tests: Debian's chromium, headless, kept off the network.

Where chromium or the playwright package is missing, the UI tests skip and say why; under
CI=true that is a failure instead, so CI cannot pass without running them (scripts/test-tools.sh
installs chromium).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import skip_here_fail_in_ci

ROOT = Path(__file__).resolve().parent.parent.parent
# Debian's chromium (scripts/test-tools.sh installs it); HVDFLOW_CHROMIUM names another.
CHROMIUM = os.environ.get("HVDFLOW_CHROMIUM", "/usr/bin/chromium")
# Screenshots go here: git-ignored, kept after the run for a person to look at.
OUTPUTS = Path(os.environ.get("HVDFLOW_TEST_OUTPUTS") or ROOT / "test-outputs") / "ui"
# Nothing but this machine: every host name resolves to nothing except 127.0.0.1, no proxy, and
# none of chromium's own background calls (updates, sync, field trials, metrics).
LAUNCH_ARGS = [
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--metrics-recording-only",
    "--disable-gpu",
]


def require_browser() -> None:
    """Skip (fail under CI=true) when chromium or playwright is missing."""
    reason = None
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        reason = f"no chromium at {CHROMIUM}: scripts/test-tools.sh installs it (Debian's chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is missing: run scripts/setup.sh"
    if reason is None:
        return
    skip_here_fail_in_ci(reason, "the browser tests")


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for a test module. Not longer: while playwright's sync API runs,
    this thread has a running event loop, and Prefect's sync calls in later tests would take
    themselves for async ones (and return coroutines)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    args = list(LAUNCH_ARGS)
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # chromium's sandbox refuses to run as root
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, request):
    """A fresh page; a screenshot of it is saved under OUTPUTS when the test ends."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    # expect() keeps its own 5 s default: too short for a single-page app on a loaded machine.
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)
    try:
        yield page
    finally:
        OUTPUTS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(OUTPUTS / f"{request.node.name}-last.png"), full_page=True)
        finally:
            context.close()


def screenshot(page, name: str) -> Path:
    """Save what the page shows now as OUTPUTS/<name>.png."""
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    path = OUTPUTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
