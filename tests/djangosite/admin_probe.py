"""Drives the project's Django admin with Django's test client and prints what it saw as
JSON (tests/test_django_admin.py judges it). Runs in its own process: Django's settings
are per process. The runs run eagerly, in this process."""

import html
import json
import os
import re
import sys
from typing import Any
from urllib.parse import quote

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
django.setup()

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.core.checks import run_checks  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.db.models import Q  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from orders import sagas  # noqa: E402
from shopsite.celery import engine  # noqa: E402

from celery_saga.contrib.django.models import saga_database  # noqa: E402
from celery_saga.store import history  # noqa: E402

RUNS = "/admin/celery_saga/run/"
seen: dict[str, object] = {}

call_command("migrate", verbosity=0)
engine.ensure_schema()
User.objects.create_superuser("root", "root@example.com", "pw")
viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
viewer.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
root, watcher = Client(), Client()
root.login(username="root", password="pw")
watcher.login(username="viewer", password="pw")

done = engine.get(engine.start("shop-order", {"order_id": "D1"}).id)
parked = engine.get(engine.start("shop-fragile", {"order_id": "P1"}).id)
parked_too = engine.get(engine.start("shop-fragile", {"order_id": "P2"}).id)
parked_three = engine.get(engine.start("shop-fragile", {"order_id": "P3"}).id)
CARD = "4000-0566-5566-5556"  # shop-approval marks "card" sensitive
waiting = engine.get(engine.start("shop-approval", {"order_id": "W1", "card": CARD}).id)
broken = engine.get(engine.start("shop-order", {"order_id": "B1"}).id)
seen["states"] = [r.state.value for r in (done, parked, parked_too, waiting)]


def page(client: Client, url: str) -> tuple[int, str]:
    reply = client.get(url)
    return reply.status_code, reply.content.decode()


def act(client: Client, action: str, run_id: str, **form: str) -> tuple[int, str]:
    data = {"action": action, "_selected_action": [run_id], **form}
    if not form:
        data["index"] = "0"
    reply = client.post(RUNS, data, follow=True)
    return reply.status_code, reply.content.decode()


OPERATOR_KINDS = ("resumed", "resolved", "abandoned", "signalled", "cancelled")


def kinds(run_id: str) -> list[list[str | None]]:
    """The run's history rows of operator actions (the engine writes the others too)."""
    rows = history.load(engine.db, run_id)
    return [[e.kind, e.actor, e.detail] for e in rows if e.kind in OPERATOR_KINDS]


status, body = page(root, RUNS)
seen["list"] = [status, all(r.id in body for r in (done, parked, waiting))]
status, body = page(root, RUNS + "?state=compensation_stuck")
seen["list_parked"] = [status, parked.id in body, done.id in body]
status, body = page(root, RUNS + f"?q={done.id}")
seen["search"] = [status, done.id in body, parked.id in body]
status, body = page(root, RUNS + f"{parked.id}/change/")
seen["detail"] = [
    status,
    "card declined for P1" in body,
    "&quot;order_id&quot;: &quot;P1&quot;" in body,
]
seen["detail_steps"] = [body.find(">reserve<"), body.find(">charge<")]
drawn = re.findall(r'data-node="([^"]*)" data-status="([^"]*)"', body)


def nodes(drawn_nodes: Any) -> list[list[str]]:
    """(name, status) of every node, depth first, as the read API gives them."""
    return [x for n in drawn_nodes for x in [[n.name, n.status], *nodes(n.children)]]


read = nodes(engine.inspect().run(parked.id).graph)
seen["detail_graph"] = [[html.unescape(n), html.unescape(s)] for n, s in drawn]
seen["read_graph"] = read
status, body = page(watcher, RUNS)
seen["viewer_list"] = [status, parked.id in body, 'value="resume"' in body]
seen["root_actions"] = ['value="resume"' in page(root, RUNS)[1]]
status, body = act(watcher, "resume", parked.id)
seen["viewer_resume"] = [status, engine.get(parked.id).state.value, kinds(parked.id)]

status, body = act(root, "resume", done.id)
seen["resume_refused"] = [
    status,
    "Refused: " in body,
    "to be compensation_stuck" in body,
    kinds(done.id),
]

sagas.UNDO_BROKEN["now"] = False
status, body = act(root, "resume", parked.id)
after = engine.get(parked.id)
seen["resume"] = [status, after.state.value, after.rollback_status.value, kinds(parked.id)]
status, body = page(root, RUNS + f"{parked.id}/change/")
seen["detail_history"] = [status, ">resumed<" in body, ">root<" in body]

# As a browser does: the CSRF token of each page goes back with its form.
strict = Client(enforce_csrf_checks=True)
strict.force_login(User.objects.get(username="root"))
token = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
listing = page(strict, RUNS)[1]
status, body = act(
    strict, "abandon", parked_too.id, csrfmiddlewaretoken=token.findall(listing)[0], index="0"
)
seen["abandon_asks"] = [status, "Abandon the unwind" in body, engine.get(parked_too.id).state.value]
confirm = next(f for f in re.findall(r"<form.*?</form>", body, re.S) if 'name="apply"' in f)
asked = (token.findall(confirm) or [""])[0]  # the confirmation's own form carries it
status, body = act(strict, "abandon", parked_too.id, apply="yes", csrfmiddlewaretoken=asked)
after = engine.get(parked_too.id)
seen["abandon"] = [status, after.state.value, after.rollback_status.value, kinds(parked_too.id)]

status, body = act(root, "resolve", parked_three.id, index="0")
plan = re.search(r'<pre class="saga-plan">(.*?)</pre>', body, re.S)
seen["resolve_asks"] = [
    status,
    html.unescape(plan[1]).splitlines()[:2] if plan else [],
    engine.get(parked_three.id).state.value,
]
status, body = act(root, "resolve", parked_three.id, apply="yes", note="released in the shop UI")
after = engine.get(parked_three.id)
seen["resolve"] = [status, after.state.value, after.rollback_status.value, kinds(parked_three.id)]
status, body = page(root, RUNS + f"{parked_three.id}/change/")
seen["resolve_detail"] = [
    "compensation_resolved" in body,
    "done by hand by root: released in the shop UI" in body,
]

status, body = page(root, f"{RUNS}{waiting.id}/change/")
seen["detail_redacted"] = [status, CARD not in body, "[redacted]" in body, "W1" in body]
# A viewer (and a superuser) asking yes/no questions of a redacted value through lookups
# in the URL: each answer says whether the list still shows the run.
STEPS, HISTORY = "/admin/celery_saga/step/", "/admin/celery_saga/historyrow/"
vendor = connections[saga_database()].vendor


def answers(client: Client, guess: str) -> bool:
    """Whether the card of ``waiting`` begins with ``guess``, by the runs list."""
    if vendor == "postgresql":  # the bytea cast to text is its hex: anchor on b"card" + header
        query = "input__contains=" + (b"card\xb3" + guess.encode()).hex()
    else:  # SQLite's REGEXP reads the blob as its Python repr: b"...card\\xb34000-..."
        query = "input__regex=" + quote(r"card\\x[0-9a-f]{2}" + re.escape(guess))
    status, body = page(client, f"{RUNS}?{query}")
    return status == 200 and waiting.id in body


def extracted(client: Client) -> str:
    found = ""
    while len(found) < len(CARD):
        extension = next((c for c in "0123456789-" if answers(client, found + c)), None)
        if extension is None:
            break
        found += extension
    return found


for client in (watcher, root):
    client.raise_request_exception = False  # a 500 is an answer here, not the probe's end
seen["extracted"] = [extracted(watcher), extracted(root)]
crafted = [
    f"{RUNS}?input=abc",
    f"{RUNS}?input__isnull=False",
    f"{RUNS}?input__startswith=x",
    f"{RUNS}?input__contains={quote(CARD)}",
    f"{RUNS}?steps__result__contains=R-",
    f"{RUNS}?history__data__contains=R-",
    f"{RUNS}?failure_reason__contains=declined",
    f"{STEPS}?result__contains=R-",
    f"{STEPS}?result__isnull=True",
    f"{STEPS}?run__input__contains={quote(CARD)}",
    f"{HISTORY}?data__contains=R-",
    f"{HISTORY}?run__input__regex=card",
]
seen["crafted"] = {url: [page(client, url)[0] for client in (watcher, root)] for url in crafted}
filters = [
    f"{RUNS}?saga=shop-approval",
    f"{RUNS}?state=waiting&rollback_status=stuck",
    f"{STEPS}?status=completed&compensation_status__isnull=True",
    f"{HISTORY}?kind=resumed",
    f"{HISTORY}?kind__isnull=False&o=1",
]
seen["filters"] = {url: page(watcher, url)[0] for url in filters}

status, body = act(root, "signal", waiting.id, apply="yes", event="approved", payload="{oops")
seen["signal_bad_json"] = [status, "not JSON" in body, engine.get(waiting.id).state.value]
status, body = act(root, "signal", waiting.id, apply="yes", event="approved", payload='{"by": "x"}')
seen["signal"] = [status, engine.get(waiting.id).state.value, kinds(waiting.id)]

# Cancel: behind a permission of its own (a viewer, and a user who may resume, abandon and
# signal, are not offered it), asked first, with an optional reason.
canceller, operator = (
    User.objects.create_user(name, password="pw", is_staff=True) for name in ("canceller", "ops")
)
viewing = Q(codename__startswith="view_")
canceller.user_permissions.set(Permission.objects.filter(viewing | Q(codename="cancel_run")))
others = Q(codename__in=["resume_run", "abandon_run", "signal_run"])
operator.user_permissions.set(Permission.objects.filter(viewing | others))
cancels, operates = Client(), Client()
cancels.login(username="canceller", password="pw")
operates.login(username="ops", password="pw")
target = engine.start("shop-approval", {"order_id": "C1", "card": CARD}).id
seen["cancel_offered"] = [
    'value="cancel"' in page(client, RUNS)[1] for client in (watcher, operates, cancels)
]
refusals = [act(client, "cancel", target, apply="yes")[0] for client in (watcher, operates)]
seen["cancel_refused"] = [refusals, engine.get(target).state.value, kinds(target)]
status, body = act(cancels, "cancel", target, index="0")
seen["cancel_asks"] = [status, "Cancel these runs?" in body, engine.get(target).state.value]
status, body = act(cancels, "cancel", target, apply="yes", reason="customer withdrew")
seen["cancel"] = [status, engine.get(target).state.value, kinds(target)]
status, body = act(cancels, "cancel", target, apply="yes")
seen["cancel_again"] = [status, "Refused: " in body, len(kinds(target))]

# Labels: shown on a run's page, searched for as label.KEY=VALUE, and a bulk cancel over
# what the search selects (one run ticked, both cancelled), as one operation.
labelled = [
    engine.start("shop-approval", {"order_id": o, "card": CARD}, labels={"customer": c}).id
    for o, c in (("L1", "L"), ("L2", "L"), ("M1", "M"))
]
SEARCH = RUNS + "?q=label.customer%3DL"
status, body = page(root, SEARCH)
seen["label_search"] = [status, [run in body for run in labelled]]
status, body = page(root, RUNS + f"{labelled[0]}/change/")
seen["label_shown"] = [status, "customer=L" in body]
ticked = {"action": "bulk_cancel", "_selected_action": [labelled[0]], "index": "0"}
reply = root.post(SEARCH, ticked, follow=True)
seen["bulk_asks"] = [reply.status_code, "as one operation?" in reply.content.decode()]
seen["bulk_asks_states"] = [engine.get(run).state.value for run in labelled]
reply = root.post(SEARCH, {**ticked, "apply": "yes", "reason": "left"}, follow=True)
seen["bulk_cancel"] = [
    reply.status_code,
    "2 run(s) acted on" in reply.content.decode(),
    [[row[1] for row in kinds(run)] for run in labelled],
]
status, body = page(root, SEARCH)
seen["bulk_moves_offered"] = [f'value="bulk_{m}"' in body for m in ("abandon", "retry", "unwind")]
reply = root.post(RUNS, ticked, follow=True)
seen["bulk_unfiltered"] = [
    reply.status_code,
    "or filter by saga or state first" in reply.content.decode(),
]

with connections[saga_database()].cursor() as cursor:
    cursor.execute("UPDATE saga_executions SET input = %s WHERE id = %s", [b"\xc1", broken.id])
status, body = page(root, RUNS + f"{broken.id}/change/")
seen["corrupt"] = [status, "this payload cannot be decoded" in body]
status, body = page(root, "/admin/celery_saga/historyrow/")
seen["history_list"] = [status, parked.id in body and waiting.id in body]
status, body = page(root, f"/admin/celery_saga/step/?q={parked.id}")
seen["step_list"] = [status, body.count(parked.id) >= 2, done.id in body]

engine.pause("shop-order", "charge", reason="provider <down>", actor="ops")
paused = engine.start("shop-order", {"order_id": "P1"}).id
status, body = page(root, "/admin/celery_saga/pausedstep/")
seen["paused_steps"] = [status, "provider &lt;down&gt;" in body, "shop-order" in body]
status, body = page(root, "/admin/celery_saga/pausedrun/")
seen["paused_runs"] = [status, paused in body, engine.get(paused).state.value]
engine.unpause("shop-order", "charge")

with override_settings(SAGA_DATABASE="nowhere"):
    seen["check"] = [message.id for message in run_checks()]
seen["check_now"] = [message.id for message in run_checks()]

json.dump(seen, sys.stdout)
