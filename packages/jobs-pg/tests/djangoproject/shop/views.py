from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from shop.jobs import Ship, ship
from shop.models import Order


class Boom(Exception):
    pass


def create_order(request: HttpRequest) -> HttpResponse:
    """POST item=..., fail=after (raise after the enqueue) or fail=inner (a nested atomic)."""
    fail = request.POST.get("fail", "")
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        if fail == "inner":
            # A savepoint: its rollback drops the job staged in it, and only that.
            try:
                with transaction.atomic():
                    ship.enqueue_sync(Ship(order_id=order.id))
                    raise Boom
            except Boom:
                pass
            return JsonResponse({"order": order.id, "job": None})
        result = ship.enqueue_sync(Ship(order_id=order.id))
        if fail == "after":
            raise Boom("after the enqueue")
    return HttpResponse(json.dumps({"order": order.id, "job": str(result.id)}))
