"""A small real Django project on PostgreSQL: one app (shop) with an Order and a ship job.

The test gives the database and the schema in the environment (``SHOP_DB_URL`` parts and
``SHOP_SCHEMA``): Django's tables and the jobs tables share that schema.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_db = urlsplit(os.environ["SHOP_DB_URL"])
SCHEMA = os.environ["SHOP_SCHEMA"]

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "jobs_pg.django", "shop"]
MIDDLEWARE: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": _db.hostname or "",
        "PORT": str(_db.port or ""),
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    }
}
JOBS = {"SCHEMA": SCHEMA, "POOL_MIN": 0, "POOL_MAX": 4, "CONCURRENCY": 2}
LOGGING_CONFIG = None
