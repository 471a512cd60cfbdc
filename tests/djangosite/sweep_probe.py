"""Reads every admin page of the runs already in the store (``SHOP_STORE``), with the
family of tests/redaction_family.py registered, and prints them as JSON for
tests/test_redaction_sweep.py to search for marked values: the lists, each run's, step's
and history row's page, and lookups crafted on the payload columns (``SWEEP_GUESSES``:
hex text of a guessed value, as PostgreSQL shows a bytea to ``LIKE``)."""

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
django.setup()

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from shopsite.celery import engine  # noqa: E402

from celery_saga.contrib.django.models import HistoryRow, Run, Step  # noqa: E402
from tests import redaction_family  # noqa: E402

ADMIN = "/admin/celery_saga/"
engine.register(*redaction_family.define())
call_command("migrate", verbosity=0)
User.objects.create_superuser("root", "root@example.com", "pw")
viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
viewer.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
clients = {"root": Client(), "viewer": Client()}
for name, client in clients.items():
    client.login(username=name, password="pw")

urls = [f"{ADMIN}run/", f"{ADMIN}step/", f"{ADMIN}historyrow/"]
urls += [f"{ADMIN}run/{run.id}/change/" for run in Run.objects.all()]
urls += [f"{ADMIN}step/{step.id}/change/" for step in Step.objects.all()]
urls += [f"{ADMIN}historyrow/{row.id}/change/" for row in HistoryRow.objects.all()]
pages = []
for url in urls:
    reply = clients["root"].get(url)
    pages.append([url, reply.status_code, reply.content.decode()])

lookups = []
for guess in json.loads(os.environ["SWEEP_GUESSES"]):
    for model, column in (("run", "input"), ("step", "result"), ("historyrow", "data")):
        for lookup in ("contains", "startswith", "regex"):
            url = f"{ADMIN}{model}/?{column}__{lookup}={guess}"
            reply = clients["viewer"].get(url)
            lookups.append([url, reply.status_code, reply.content.decode()])

json.dump({"pages": pages, "lookups": lookups}, sys.stdout)
