"""Pure decision functions: plain data in, a small value out. No I/O, no Celery, no SQL."""
