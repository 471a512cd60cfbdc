from django.http import HttpRequest, JsonResponse
from shopsite.celery import engine


def start_order(request: HttpRequest, saga: str) -> JsonResponse:
    run = engine.start(saga, {"order_id": request.GET["order_id"]})
    return JsonResponse({"id": run.id})
