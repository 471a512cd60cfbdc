"""Drives the admin's moves on held runs (issue 42) and ``manage.py saga retry`` with
Django's test client and ``call_command``, and prints what it saw as JSON
(tests/test_django_held.py judges it). The runs run eagerly, in this process."""

import contextlib
import io
import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
django.setup()

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db.models import Q  # noqa: E402
from django.test import Client  # noqa: E402
from shopsite.celery import engine  # noqa: E402

from celery_saga import Saga  # noqa: E402
from celery_saga.store import history  # noqa: E402

RUNS = "/admin/celery_saga/run/"
DOWN = {"now": True}
seen: dict[str, object] = {}


def reserve(order_id: str) -> str:
    return f"R-{order_id}"


def release(order_id: str) -> None:
    return None


def charge(order_id: str) -> str:
    if DOWN["now"]:
        raise ConnectionError(f"the payment provider is down ({order_id})")
    return f"C-{order_id}"


engine.register(
    Saga("shop-held")
    .step("reserve", reserve, compensate=release)
    .step("charge", charge, compensate=release, on_failure="hold")
    .step("ship", reserve)
)
call_command("migrate", verbosity=0)
engine.ensure_schema()
viewing = Q(codename__startswith="view_")
mover, viewer = (User.objects.create_user(n, password="pw", is_staff=True) for n in ("ops", "v"))
mover.user_permissions.set(Permission.objects.filter(viewing | Q(codename="move_held_run")))
viewer.user_permissions.set(Permission.objects.filter(viewing | Q(codename="cancel_run")))
moves, views = Client(), Client()
moves.login(username="ops", password="pw")
views.login(username="v", password="pw")


def held() -> str:
    return str(engine.start("shop-held", {"order_id": "H"}).id)


def act(client: Client, action: str, run_id: str, **form: str) -> tuple[int, str]:
    data = {"action": action, "_selected_action": [run_id], **form}
    reply = client.post(RUNS, data, follow=True)
    return reply.status_code, reply.content.decode()


def moved(run_id: str) -> list[list[str | None]]:
    rows = history.load(engine.db, run_id)
    return [[e.kind, e.actor, e.detail] for e in rows if e.kind.startswith("hold-")]


def state(run_id: str) -> str:
    return engine.get(run_id).state.value


first, second, third, fourth = held(), held(), held(), held()
seen["held"] = [state(r) for r in (first, second, third, fourth)]
page = moves.get(RUNS + f"{first}/change/").content.decode()
seen["page"] = ["held at step &#x27;charge&#x27;" in page or "held at step 'charge'" in page]
seen["offered"] = [f'value="{m}"' in views.get(RUNS).content.decode() for m in ("retry",)]
seen["offered"] += [f'value="{m}"' in moves.get(RUNS).content.decode() for m in ("retry",)]
status, _ = act(views, "retry", first, apply="yes")
seen["refused"] = [status, state(first), moved(first)]
status, body = act(moves, "retry", first)
seen["asks"] = [status, "Run the held step of these runs again" in body, state(first)]
DOWN["now"] = False
status, _ = act(moves, "retry", first, apply="yes", reason="provider back")
seen["retry"] = [status, state(first), moved(first)]
status, body = act(moves, "skip", second, apply="yes", result="{oops")
seen["skip_bad_json"] = [status, "not JSON" in body, state(second)]
status, _ = act(moves, "skip", second, apply="yes", result='"C-by-hand"')
seen["skip"] = [status, state(second), engine.get(second).step("charge").result, moved(second)]
status, _ = act(moves, "unwind", third, apply="yes", reason="customer gave up")
seen["unwind"] = [status, state(third), moved(third)]
status, body = act(moves, "retry", third, apply="yes")
seen["again"] = [status, "it is failed" in body, len(moved(third))]
with contextlib.redirect_stdout(io.StringIO()):  # the command's own line
    call_command("saga", "retry", fourth, "--reason", "from the shell")
seen["command"] = [state(fourth), moved(fourth)[0][2]]
json.dump(seen, sys.stdout)
