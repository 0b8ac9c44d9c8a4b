"""The example shop for WSGI servers: ``gunicorn examples.http.django_shop.wsgi:application``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.http.django_shop.settings")
application = get_wsgi_application()
