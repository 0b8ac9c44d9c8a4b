"""The console's web app: server-rendered pages and a JSON API over ``idemctl.operate``,
with nothing of its own but who may see and do what (``guard``, ``auth``) and the operator
log.

Each page has its view (``views``, ``actions``): the ``--json`` document of the command
that shows the same thing. ``/PAGE`` renders it through Jinja2 with autoescaping (a key
holding markup shows as text); ``/api/PAGE`` returns it. Store calls run in a worker
thread, so a slow sweep never stalls the other pages or ``/healthz``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from idemctl.console import actions, guard, views
from idemctl.console.auth import Proxy, Sessions, Users
from idemctl.console.oplog import OperatorLog
from idemctl.console.pages import PAGES
from idemctl.errors import EntityNotFound, IdemctlError, KeyNotFound, OptionError, StoreUnavailable


@dataclass
class Console:
    """What one console process serves: its store, who may use it and what they may do."""

    where: views.Where
    users: Users | None
    proxy: Proxy | None
    no_auth: bool
    allow_repair: bool
    oplog: OperatorLog
    secure: bool = False
    """Behind TLS: cookies are ``Secure``."""
    sessions: Sessions = field(default_factory=Sessions)


View = Callable[[Console, Request], Any]
"""A page's view: (console, request) -> its document (called in a worker thread)."""


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def render(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
    """The page ``name`` for the request's user (its CSRF token in every form)."""
    console = console_of(request)
    session = guard.session(request)
    html = PAGES.get_template(name).render(
        user=request.state.user, csrf=session.csrf if session else "",
        store=console.where.target.url, layout=console.where.target.layout,
        repair=console.allow_repair, params=request.query_params, **values,
    )  # fmt: skip
    return HTMLResponse(html, status_code=status)


def page(path: str, template: str, view: View) -> list[Route]:
    """``path`` rendered by ``template``, and its document at ``/api`` + ``path``."""

    async def html(request: Request) -> Response:
        document = await run_in_threadpool(view, console_of(request), request)
        return render(request, template, doc=document)

    async def api(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(view, console_of(request), request))

    return [Route(path, html), Route("/api" + path, api)]


async def key(request: Request) -> Response:
    """A key's record; POST (a form with its token) reveals its result, and is logged."""
    reveal = request.method == "POST"
    if reveal:
        await guard.checked_form(request)
    document = await run_in_threadpool(_key, console_of(request), request, reveal)
    return render(request, "key.html", doc=document)


async def api_key(request: Request) -> Response:
    """``inspect --json``: ``?reveal=1`` (operators) shows the result, and is logged."""
    reveal = request.query_params.get("reveal") == "1"
    return JSONResponse(await run_in_threadpool(_key, console_of(request), request, reveal))


def _key(console: Console, request: Request, reveal: bool) -> dict[str, Any]:
    name = request.path_params["key"]
    if reveal and not request.state.user.operator:
        raise HTTPException(403, f"{request.state.user.name} is a viewer: results stay masked")
    document = views.key(console.where, name, reveal)
    if reveal:  # logged once shown: a key that is not there reveals nothing
        console.oplog.write(request.state.user.name, "reveal", name, "shown")
    return document


async def act(request: Request) -> Response:
    """An action: its dry run (GET), or, confirmed (POST), the action itself, logged."""
    console = console_of(request)
    chosen = actions.act(request.path_params["name"])
    api = request.url.path.startswith("/api/")
    guard.may_repair(request)
    params: Mapping[str, str] = request.query_params
    if request.method == "POST":
        params = {k: str(v) for k, v in (await guard.checked_form(request)).items()}
    preview = await run_in_threadpool(chosen.run, console.where, params, True)
    expected = chosen.confirmation(preview, params)
    if request.method == "GET" or params.get("confirm") != expected:
        status = 400 if request.method == "POST" else 200
        if api:
            return JSONResponse({**preview, "confirm": expected}, status)
        fields = {k: v for k, v in params.items() if k not in ("csrf", "confirm")}
        return render(request, "confirm.html", status, act=chosen, doc=preview,
                      expected=expected, mistyped=status == 400, fields=fields)  # fmt: skip
    try:
        done = await run_in_threadpool(chosen.run, console.where, params, False)
        result = f"{done.get('count', 0)} done"
    except IdemctlError as exc:
        done, result = {"error": str(exc)}, f"refused: {exc}"
    entry = console.oplog.write(
        request.state.user.name, chosen.name, chosen.subject(params), result
    )
    if api:
        return JSONResponse({**done, "logged": entry.to_json()})
    return RedirectResponse("/log", 303)


def _audit(console: Console, request: Request) -> dict[str, Any] | None:
    """An audit when the form named a group or a topic; else nothing yet."""
    if not request.query_params.get("group") and not request.query_params.get("topic"):
        if request.url.path.startswith("/api/"):
            raise OptionError("group", "an audit needs ?group=G&topic=T")
        return None
    return views.audit(console.where, request.query_params)


def _oplog(console: Console, request: Request) -> dict[str, Any]:
    return {"entries": [e.to_json() for e in console.oplog.recent()]}


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def error(request: Request, exc: Exception) -> Response:
    """An error as JSON under ``/api/``, else a page (escaped, as everything)."""
    status, detail = _status_of(exc)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": detail}, status)
    if getattr(request.state, "user", None) is None:
        return PlainTextResponse(f"{status}: {detail}", status)
    return render(request, "error.html", status, code=status, detail=detail)


def _status_of(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, KeyNotFound | EntityNotFound):
        return 404, str(exc)
    if isinstance(exc, StoreUnavailable):
        return 503, str(exc)
    return 400, str(exc)


def make_app(console: Console) -> Starlette:
    """The console's ASGI app."""
    routes = [
        Route("/healthz", healthz),
        Route("/login", guard.login, methods=["GET", "POST"]),
        Route("/logout", guard.logout, methods=["POST"]),
        *page("/", "overview.html", lambda c, r: views.overview(c.where)),
        *page("/keys", "keys.html", lambda c, r: views.keys(c.where, r.query_params)),
        Route("/keys/{key:path}", key, methods=["GET", "POST"]),
        Route("/api/keys/{key:path}", api_key),
        *page("/entities", "entities.html", lambda c, r: views.entities(c.where, r.query_params)),
        *page(
            "/entities/{entity:path}",
            "entity.html",
            lambda c, r: views.entity(c.where, r.path_params["entity"]),
        ),
        *page("/outbox", "outbox.html", lambda c, r: views.outbox(c.where)),
        *page("/audit", "audit.html", _audit),
        *page("/log", "log.html", _oplog),
        Route("/actions/{name}", act, methods=["GET", "POST"]),
        Route("/api/actions/{name}", act, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(packages=[("idemctl.console", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(guard.Guard)],
        exception_handlers={HTTPException: error, IdemctlError: error},
    )
    app.state.console = console
    return app


def serve(console: Console, host: str, port: int) -> None:
    """Serve ``console`` with uvicorn until SIGTERM or Ctrl-C."""
    import uvicorn

    uvicorn.run(make_app(console), host=host, port=port, log_level="warning")
