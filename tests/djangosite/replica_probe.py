"""Opens the admin's run list and the pages of the runs ``SHOP_RUNS`` names while the admin
reads a replica of the store (``SHOP_READ_STORE``), and prints as JSON what each showed
(tests/test_read_replica.py judges it). Runs in its own process: Django's settings are per
process."""

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.checks import run_checks  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client, override_settings  # noqa: E402

RUNS = "/admin/celery_saga/run/"
#: The warning's words (the admin capitalises a message's first letter).
SAID = "from a replica up to "

call_command("migrate", verbosity=0)
User.objects.create_superuser("root", "root@example.com", "pw")
root = Client()
root.login(username="root", password="pw")
seen: dict[str, object] = {"checks": [str(problem) for problem in run_checks()]}
listed = root.get(RUNS)
body = listed.content.decode()
seen["list"] = [listed.status_code, [run in body for run in os.environ["SHOP_RUNS"].split(",")]]
seen["list_says"] = SAID in body
pages = [
    root.get(f"{RUNS}{run}/change/", follow=True) for run in os.environ["SHOP_RUNS"].split(",")
]
seen["pages"] = [reply.status_code for reply in pages]
seen["page_says"] = [SAID in reply.content.decode() for reply in pages]
with override_settings(SAGA_READ_DATABASE="nowhere"):
    seen["check_unknown"] = [problem.id for problem in run_checks()]
print(json.dumps(seen))
