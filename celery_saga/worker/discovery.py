"""Finding sagas the way Celery finds tasks: ``engine.autodiscover_sagas()``.

Definitions are registered by the modules that define them: an installed app's
``sagas.py``, or a Celery ``tasks.py``. A worker (and beat) imports those modules when it
starts, on Celery's ``import_modules`` signal, as ``app.autodiscover_tasks()`` does for
tasks. Any other process that configured Celery (a web process, ``manage.py shell``)
imports them the first time it looks up a saga it does not know: then a lookup never
depends on which module happened to be imported first.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable

from celery import Celery

from celery_saga.errors import SagaError

#: Package names, or a callable returning them (evaluated when discovery runs).
Packages = Iterable[str] | Callable[[], Iterable[str]] | None


def import_related(package: str, related_name: str) -> str | None:
    """Import ``<package>.<related_name>``; its name, or None when the package has no such
    module. A missing package is a ``SagaError``; a failing import inside the module is
    raised as it is: both are mistakes to show, not modules to skip."""
    name = f"{package}.{related_name}"
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            return None
        if error.name and (package == error.name or package.startswith(error.name + ".")):
            raise SagaError(
                f"autodiscover_sagas: package {package!r} cannot be imported ({error}); "
                "name importable packages"
            ) from None
        raise
    return name


class SagaDiscovery:
    """The requested discoveries of one engine, run at worker start or on a lookup miss."""

    def __init__(self, app: Celery, when_modules_imported: Callable[[Callable[[], None]], None]):
        self.app = app
        self._when_modules_imported = when_modules_imported
        self._requests: list[tuple[Packages, str]] = []
        # Reentrant: a discovered module registers sagas, which may look names up again.
        self._lock = threading.RLock()
        self._running = False
        self._pending = True
        self._connected = False
        self.found: list[str] = []

    def request(self, packages: Packages, related_name: str, force: bool) -> None:
        if not isinstance(related_name, str) or not related_name.isidentifier():
            raise SagaError(
                f"autodiscover_sagas(related_name=...) must be a module name, got {related_name!r}"
            )
        with self._lock:
            if force:  # first: a package that cannot be imported is not recorded
                self._import(packages, related_name)
            self._requests.append((packages, related_name))
            self._pending = True
            if not self._connected:
                self._when_modules_imported(self.import_requested)
                self._connected = True

    def import_requested(self) -> None:
        """Import the related module of every requested package (those already imported
        cost a dictionary lookup)."""
        with self._lock:
            for packages, related_name in list(self._requests):
                self._import(packages, related_name)

    def _import(self, packages: Packages, related_name: str) -> None:
        for package in self._packages(packages):
            name = import_related(package, related_name)
            if name is not None and name not in self.found:
                self.found.append(name)

    def _packages(self, packages: Packages) -> list[str]:
        if callable(packages):
            packages = packages()
        if packages is not None:
            return [packages] if isinstance(packages, str) else list(packages)
        # As Celery does for tasks: the fix-ups (Django's) name the installed apps.
        fixups = getattr(self.app, "_fixups", None) or []
        return [
            name
            for f in fixups
            if hasattr(f, "autodiscover_tasks")
            for name in f.autodiscover_tasks()
        ]

    def discover(self) -> None:
        """On a lookup miss, once until a new request: the requested modules, then the
        Celery app's own task modules (``imports``, ``include``, ``autodiscover_tasks``),
        which a process that is not a worker never imports on its own."""
        if not self._pending:
            return
        with self._lock:
            if not self._pending or self._running:
                return
            self._running = True
            try:
                self.import_requested()
                self.app.loader.import_default_modules()
                self._pending = False
            finally:
                self._running = False

    def where(self) -> str:
        """Where this process looked for sagas, for an ``UnknownSagaError``."""
        task_modules = sorted(
            name for name in self.app.loader.task_modules if not name.startswith("celery.")
        )
        searched = ", ".join(dict.fromkeys(self.found + task_modules)) or "none found"
        if self._requests:
            asked = ", ".join(sorted({f"<app>.{name}" for _, name in self._requests}))
            return (
                f"looked for in the modules {asked} of the discovered packages and in the "
                f"Celery app's task modules (imported: {searched})"
            )
        return (
            f"looked for only in the Celery app's task modules (imported: {searched}); "
            "register sagas in an installed app's sagas.py and call engine.autodiscover_sagas() "
            "where the Celery app is defined, or import the defining module there"
        )
