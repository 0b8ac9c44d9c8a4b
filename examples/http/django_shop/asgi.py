"""The example shop for ASGI servers: ``uvicorn examples.http.django_shop.asgi:application``.
Its sync views run in threads, the middleware's guard with them."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.http.django_shop.settings")
application = get_asgi_application()
