"""The example Django shop's ASGI application inside idemctl's ASGI middleware, with no
Django middleware of idemctl's: the set-up issue 58's finding 5 was found with (a client
that hangs up under uvicorn; Django cancels the request while its sync view runs on).

    uvicorn tests.http.django_wrapped:application
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from idemctl.http import Options
from idemctl.http.asgi import IdempotencyMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.http.django_shop.settings")
# Before the application loads its middleware: the guard is the ASGI one, outside Django.
settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.startswith("idemctl.")]
lease = os.environ.get("IDEMCTL_LEASE")
options = Options(lease=float(lease) if lease else None)
application = IdempotencyMiddleware(
    get_asgi_application(), store=os.environ.get("IDEMCTL_STORE"), options=options
)
