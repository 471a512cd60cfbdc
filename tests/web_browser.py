"""Headless Chromium for the web view's tests and the docs' screenshots: Debian's
``chromium`` and ``chromium-driver`` (``.ci/run`` installs them), driven by selenium."""

from __future__ import annotations

import base64
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery_saga.web import WebSettings, create_app

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def _first(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((path for path in extra if os.path.exists(path)), None)


def missing() -> str | None:
    """What is missing to drive Chromium here, or None."""
    if _first(CHROMIUM) is None:
        return "no chromium on PATH (apt-get install chromium chromium-driver)"
    if _first(DRIVER, ("/usr/lib/chromium/chromedriver",)) is None:
        return "no chromedriver on PATH (apt-get install chromium-driver)"
    return None


def chromium(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium session (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM) or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={width},{height}")
    driver_path = _first(DRIVER, ("/usr/lib/chromium/chromedriver",))
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))


def send_basic_auth(driver: Any, user: str, password: str) -> None:
    """Every request the browser makes from now on carries these credentials, as a browser
    that answered the login prompt does (headless Chromium shows no prompt)."""
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    headers = {"headers": {"Authorization": f"Basic {pair}"}}
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", headers)


@contextmanager
def serving(engine: Any, settings: WebSettings) -> Iterator[str]:
    """The web view over ``engine`` served by waitress (as ``saga web`` serves it) in a
    thread of this process; yields its base URL."""
    import waitress

    server = waitress.create_server(
        create_app(engine, settings), host="127.0.0.1", port=0, threads=4
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.close()
        thread.join(timeout=10)
