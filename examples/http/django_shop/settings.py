"""Django settings of the example shop: ``POST /charges`` (a plain Django view) and ``POST
/drf/charges`` (a Django REST framework APIView), guarded by idemctl's Django middleware.
No database: ``DATABASES = {}``. From the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m gunicorn -w 2 --threads 8 examples.http.django_shop.wsgi:application
    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m uvicorn examples.http.django_shop.asgi:application

The store is ``$IDEMCTL_STORE`` (None here: the middleware reads it then); ``IDEMCTL_LEASE``
and ``IDEMCTL_WAIT`` (seconds) set the options' lease and wait, for tests.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.http.django_shop.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES: dict[str, Any] = {}
USE_TZ = True

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Last: it calls a guarded view itself, once the others' process_view (CSRF, ...) ran.
    "idemctl.http.django.IdempotencyMiddleware",
]


def _seconds(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


IDEMCTL_HTTP: dict[str, Any] = {
    "STORE": os.environ.get("IDEMCTL_STORE"),  # None: $IDEMCTL_STORE, else the default
    "OPTIONS": {
        "lease": _seconds("IDEMCTL_LEASE"),
        "wait": _seconds("IDEMCTL_WAIT"),
        # Views not marked with idempotent() or IdempotentMixin, guarded by their path:
        "paths": ["/export*"],
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],  # no django.contrib.auth: no users, no sessions
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
