#!/usr/bin/env python
"""A minimal Django project laid out as Celery's Django guide says: the Celery app in
``shopsite/celery.py`` with ``app.autodiscover_tasks()``, sagas in ``orders/sagas.py`` (and
one in ``orders/tasks.py``), a view that starts them. Nothing imports those modules
explicitly: the suite checks that every process finds them anyway."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
