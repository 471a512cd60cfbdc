# As Celery's Django guide says: the app is loaded whenever Django starts.
from shopsite.celery import app as celery_app

__all__ = ["celery_app"]
