"""The name this process goes by in the store (``celery saga versions``, hand-backs): the
Celery worker's node name once a worker starts, else host and process id."""

from __future__ import annotations

import os
import socket

_name: str | None = None


def process_name() -> str:
    return _name or f"{socket.gethostname()}/{os.getpid()}"


def set_process_name(name: str) -> None:
    global _name
    _name = name[:200]
