"""``Idempotency-Key`` for Django and Django REST framework: a middleware configured by
Django's settings, with per-view options.

    # settings.py
    MIDDLEWARE = [
        ...,  # CSRF, authentication, ... first: their process_view runs before the view
        "idemctl.http.django.IdempotencyMiddleware",  # last
    ]
    IDEMCTL_HTTP = {
        "STORE": "redis://127.0.0.1:6379/0",  # None or left out: $IDEMCTL_STORE
        "OPTIONS": {"wait": 10},  # idemctl.http.Options' fields; "paths" guards by path
    }

    # views.py
    from idemctl.http.django import IdempotentMixin, idempotent

    @require_POST
    @idempotent(wait=10)  # Options' fields, over the settings' OPTIONS
    def charge(request): ...  # request.idempotency: the attempt (its fencing token, ...)

    class Charges(IdempotentMixin, APIView):  # DRF (or any class-based view)
        idempotency = {"methods": ["POST"]}  # or Options(...); {} by default

A guarded view runs in the middleware's ``process_view``, inside the sync engine
(``idemctl.http.attempt``): its key is claimed, the view called, and its response stored,
then sent (or the stored one replayed, or a problem answered). Views neither marked nor
matched by the settings' ``paths`` pass through untouched.

Under ASGI Django runs a sync ``process_view`` in a thread of its own, with the view: a
client that hangs up cancels Django's task but not that thread, so the view runs to its end
and its response is stored for the client's retry; an async view is shielded the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
from django.core.handlers.exception import (  # type: ignore[import-untyped]
    response_for_exception,
)
from django.http import HttpResponse  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from idemctl.http import policy
from idemctl.http.attempt import attempt, body_limit
from idemctl.http.policy import Attempt, Options, Problem, Response, Streamed
from idemctl.http.stats import STATS
from idemctl.http.tracing import observed

if TYPE_CHECKING:
    from idemctl.stores.base import Store

SETTING = "IDEMCTL_HTTP"
"""The Django setting: ``{"STORE": url, "OPTIONS": {...}}``."""
ATTEMPT = "idemctl.attempt"
"""``request.META``'s key for the attempt too (as ``environ`` has it under the WSGI
middleware); the view finds it as ``request.idempotency``."""
IMPORTED = ("caller", "redact")
"""Options' fields that the settings may give as a dotted path to a function."""

V = TypeVar("V")


class IdempotentMixin:
    """Marks a class-based view (DRF's ``APIView`` and viewsets, Django's ``View``) as
    guarded: ``idempotency`` holds its options, an ``Options`` or a dict of its fields
    over the settings' ``OPTIONS``."""

    idempotency: ClassVar[Options | Mapping[str, Any] | None] = None


def idempotent(options: Options | None = None, **fields: Any) -> Callable[[V], V]:
    """Marks a view (a function, or a class) as guarded, with ``options`` (used as they
    are) or Options' ``fields`` (over the settings' ``OPTIONS``). Above ``@api_view``
    for a DRF function view."""
    if options is not None and fields:
        raise ImproperlyConfigured("idempotent() takes options= or Options' fields, not both")
    given: Options | Mapping[str, Any] = options if options is not None else dict(fields)
    if not isinstance(given, Options):
        _options({}, given)  # a misspelt field fails at import, not at the first request

    def mark(view: V) -> V:
        view.idempotency = given  # type: ignore[attr-defined]
        return view

    return mark


def marked(view: Callable[..., Any]) -> Options | Mapping[str, Any] | None:
    """The options ``view`` was marked with: by ``idempotent`` (on the function, or on the
    class ``as_view`` made it of), or by ``IdempotentMixin``; None when it is not marked."""
    own = getattr(view, "idempotency", None)
    if isinstance(own, Options | Mapping):
        return own
    for name in ("cls", "view_class"):  # DRF's as_view, Django's as_view
        cls = getattr(view, name, None)
        if not isinstance(cls, type):
            continue
        value = getattr(cls, "idempotency", None)
        if isinstance(value, Options | Mapping):
            return value
        if issubclass(cls, IdempotentMixin):
            return {}
    return None


def _options(base: Mapping[str, Any], fields: Mapping[str, Any]) -> Options:
    """Options of ``fields`` over ``base``, dotted paths of ``IMPORTED`` fields imported."""
    known = {f.name for f in dataclasses.fields(Options) if f.init}
    merged = {**base, **fields}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"{SETTING} OPTIONS or idempotent(): no such option {', '.join(unknown)} "
            f"(idemctl.http.Options has {', '.join(sorted(known))})"
        )
    for name in IMPORTED:
        if isinstance(merged.get(name), str):
            merged[name] = import_string(merged[name])
    try:
        return Options(**merged)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{SETTING}: {exc}") from exc


def configured() -> tuple[str | Store | None, dict[str, Any]]:
    """The settings' store (None: ``$IDEMCTL_STORE``, else the embedded default) and
    ``OPTIONS``."""
    conf = getattr(settings, SETTING, None) or {}
    if not isinstance(conf, Mapping):
        raise ImproperlyConfigured(f"{SETTING} must be a dict with STORE and OPTIONS")
    unknown = sorted(set(conf) - {"STORE", "OPTIONS"})
    if unknown:
        raise ImproperlyConfigured(f"{SETTING}: unknown keys {unknown} (STORE, OPTIONS)")
    fields = conf.get("OPTIONS") or {}
    if not isinstance(fields, Mapping):
        raise ImproperlyConfigured(f"{SETTING}['OPTIONS'] must be a dict of Options' fields")
    return conf.get("STORE"), dict(fields)


class IdempotencyMiddleware:
    """Django's middleware (sync and async capable): guards the views marked with
    ``idempotent`` or ``IdempotentMixin``, and those whose path matches the settings'
    ``OPTIONS["paths"]`` (when given), on the settings' store."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)
        self._given, self._fields = configured()
        self.options = _options({}, self._fields)
        """The settings' options: those of the paths they guard."""
        self._by_path = "paths" in self._fields
        self._store: Store | None = None
        self._opening = threading.Lock()
        self._views: dict[Any, Options | None] = {}
        _check_last(type(self))

    @property
    def store(self) -> Store:
        """The store, opened on the first guarded request (in each process)."""
        if self._store is None:
            with self._opening:
                if self._store is None:
                    from idemctl.http import opened

                    self._store = opened(self._given)
        return self._store

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self._acall(request)
        return self.get_response(request)

    async def _acall(self, request: Any) -> Any:
        return await self.get_response(request)

    def view_options(self, view: Callable[..., Any]) -> Options | None:
        """The options of a marked view (any path), None for one that is not marked."""
        try:
            return self._views[view]
        except (KeyError, TypeError):
            pass
        given = marked(view)
        if given is None:
            found = None
        elif isinstance(given, Options):
            found = dataclasses.replace(given, paths=("*",))
        else:
            found = _options(self._fields, {**given, "paths": ("*",)})
        with contextlib.suppress(TypeError):  # an unhashable view: looked up each time
            self._views[view] = found
        return found

    def process_view(
        self,
        request: Any,
        view: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run a guarded view in the engine and answer for it; None for the others, which
        Django calls as usual."""
        request.idempotency = None
        method = str(request.method).upper()
        path = policy.request_path(str(request.path).encode("utf-8"))
        options = self.view_options(view)
        if options is None and self._by_path:
            options = self.options
        if options is None or not options.guards(method, path):
            return None
        started = time.perf_counter()
        headers = {str(k).lower(): str(v) for k, v in request.headers.items()}
        name = options.header.lower()
        key = policy.key_of(options, headers.get(name), _fields(request, name))
        if key is None:
            return None
        if isinstance(key, Problem):
            STATS.count(key.outcome, time.perf_counter() - started)
            return to_django(key.response(options))
        body = bytes(request.body)
        query = str(request.META.get("QUERY_STRING", ""))
        request_seen = policy.Request(method, path, headers, query)
        guarded = policy.guarded(options, request_seen, key, body)
        store = self.store
        limit = body_limit(options, store)
        sent: list[Any] = []  # the view's own response, once it ran
        produced: list[Response | Streamed] = []
        with observed(guarded, started) as seen:

            def run_view(a: Attempt) -> Response | Streamed:
                app_started = time.perf_counter()
                request.idempotency = a
                request.META[ATTEMPT] = a
                try:
                    response = _called(view, request, args, kwargs)
                    sent[:] = [response]
                    produced[:] = [_captured(response, limit)]
                finally:
                    seen.app_seconds = time.perf_counter() - app_started
                return produced[0]

            result = attempt(store, options, guarded, run_view)
            outcome, response = policy.answer(
                options, result, datetime.now(UTC), guarded.request, seen.typical()
            )
            seen.ended(outcome)
        if sent and (response is None or (produced and response is produced[0])):
            return sent[0]  # the view's own response: cookies, closers and all
        if response is None:  # pragma: no cover - the engine sent nothing of its own
            raise RuntimeError(f"{guarded.stored_key}: no response to send")
        return to_django(response)


def _check_last(cls: type) -> None:
    """The middleware must come after every middleware with a ``process_view`` (CSRF,
    ...): it calls the view itself, so theirs would not run for a guarded view."""
    names = list(getattr(settings, "MIDDLEWARE", None) or [])
    mine = [i for i, name in enumerate(names) if _is(name, cls)]
    if not mine:
        return
    later = [name for name in names[mine[-1] + 1 :] if hasattr(_load(name), "process_view")]
    if later:
        raise ImproperlyConfigured(
            f"{names[mine[-1]]} must come after {', '.join(later)} in MIDDLEWARE: it calls "
            "a guarded view itself, so a later middleware's process_view would not run"
        )


def _load(name: str) -> Any:
    try:
        return import_string(name)
    except ImportError:
        return None  # Django itself reports it


def _is(name: str, cls: type) -> bool:
    loaded = _load(name)
    return isinstance(loaded, type) and issubclass(loaded, cls)


def _fields(request: Any, name: str) -> int:
    """How many header fields named ``name`` the request has: counted under ASGI (the
    scope keeps them apart); 1 under WSGI, whose server joined them already."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, Mapping) or "headers" not in scope:
        return 1
    wanted = name.encode("latin-1")
    return max(1, sum(1 for k, _ in scope["headers"] if bytes(k).lower() == wanted))


def _called(
    view: Callable[..., Any], request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The view's response, rendered (a TemplateResponse, DRF's Response); an exception
    becomes the response Django would send for it (a 404, a 500)."""
    try:
        if iscoroutinefunction(view):
            response = async_to_sync(_shielded)(view(request, *args, **kwargs))
        else:
            response = view(request, *args, **kwargs)
        if response is None:
            raise ValueError(f"the view {view!r} returned None instead of a response")
        if callable(getattr(response, "render", None)):
            response = response.render()
    except Exception as exc:
        response = response_for_exception(request, exc)
    return response


async def _shielded(view: Awaitable[V]) -> V:
    """Await an async view to its end: Django cancels the request's task when the client
    hangs up, and the guarded view's response is still to be stored."""
    task = asyncio.ensure_future(view)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()


def _captured(response: Any, limit: int) -> Response | Streamed:
    """The policy's copy of the view's response, its body buffered up to ``limit`` bytes.
    A streaming response past it is left to stream what was read and the rest: Streamed,
    its size its ``Content-Length`` or, without one, at least the bytes read (Django sends
    it only once the view has returned, after its key was completed)."""
    status = int(response.status_code)
    headers = [(str(k), str(v)) for k, v in response.items()]
    headers += [("Set-Cookie", morsel.OutputString()) for morsel in response.cookies.values()]
    if not getattr(response, "streaming", False):
        return Response(status, headers, bytes(response.content))
    more: object
    if response.is_async:
        chunks, rest = async_to_sync(_take_async)(response.streaming_content, limit)
        response.streaming_content = _chained_async(chunks, rest)
        more = rest
    else:
        chunks, rest_sync = _take(response.streaming_content, limit)
        response.streaming_content = (
            chunks if rest_sync is None else itertools.chain(chunks, rest_sync)
        )
        more = rest_sync
    if more is None:
        return Response(status, headers, b"".join(chunks))
    declared = response.get("Content-Length", "")
    size = int(declared) if declared.isdigit() else sum(map(len, chunks))
    return Streamed(status, headers, size)


def _take(parts: Iterable[bytes], limit: int) -> tuple[list[bytes], Iterator[bytes] | None]:
    """The chunks of ``parts`` up to past ``limit`` bytes, and the rest (None: no more)."""
    chunks: list[bytes] = []
    size = 0
    iterator = iter(parts)
    for chunk in iterator:
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return chunks, iterator
    return chunks, None


async def _take_async(
    parts: AsyncIterator[bytes], limit: int
) -> tuple[list[bytes], AsyncIterator[bytes] | None]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in parts:
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return chunks, parts
    return chunks, None


async def _chained_async(
    chunks: list[bytes], rest: AsyncIterator[bytes] | None
) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
    if rest is not None:
        async for chunk in rest:
            yield chunk


def to_django(response: Response) -> Any:
    """An ``HttpResponse`` of the policy's response: a replay or a problem, byte for byte
    (a header given twice is joined with ``, ``; ``Set-Cookie`` goes to the cookies)."""
    out = HttpResponse(response.body, status=response.status)
    del out["Content-Type"]
    for name, value in response.headers:
        if name.lower() == "set-cookie":
            out.cookies.load(value)
        elif name in out:
            out[name] = f"{out[name]}, {value}"
        else:
            out[name] = value
    return out
