from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=40)
    shipped = models.BooleanField(default=False)
