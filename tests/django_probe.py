"""Runs one probe script of the minimal Django project (tests/djangosite) in a process of
its own, as Django can be set up once per process, and returns the JSON it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

from tests.conftest import ROOT

SITE = ROOT / "tests" / "djangosite"


def run_probe(script: str, store: str, queue: str, **settings: str) -> dict[str, Any]:
    """``script`` against the saga store ``store``, eagerly, on a queue named after
    ``queue``; ``settings``: more of the site's ``SHOP_*`` (or the probe's own) variables."""
    env = {
        **os.environ,
        "SHOP_BROKER": "memory://",
        "SHOP_QUEUE": f"{queue}-{uuid.uuid4().hex[:8]}",
        "SHOP_STORE": store,
        "SHOP_EAGER": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]),
        **settings,
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, script], cwd=SITE, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen
