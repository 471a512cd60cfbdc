#!/usr/bin/env python
"""A minimal Django project for the suite: ``manage.py saga ...`` against the test app."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
