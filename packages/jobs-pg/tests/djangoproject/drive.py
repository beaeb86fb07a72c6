"""Drive the shop's view through Django's test client; print one JSON line per request.

``python drive.py after|inner|ok ...``: each argument is one POST to /orders/.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_settings")

import django

django.setup()

from django.test import Client  # noqa: E402

client = Client(raise_request_exception=False)
for kind in sys.argv[1:]:
    data = {"item": "book"} | ({} if kind == "ok" else {"fail": kind})
    answer = client.post("/orders/", data)
    body = answer.content.decode() if answer.status_code == 200 else ""
    print(json.dumps({"kind": kind, "status": answer.status_code, "body": body}), flush=True)
