"""The console's web app: server-rendered pages and a JSON API over ``idemctl.operate``,
with nothing of its own but who may see and do what (``auth``) and the operator log.

Every page and API call runs an operate function on the target the console was started
on; a page renders its result through Jinja2 with autoescaping (a key holding markup shows
as text), the API returns the ``--json`` documents (``idemctl.operate.documents``).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from idemctl import operate
from idemctl.console.auth import OPERATOR, Proxy, Session, Sessions, User, Users
from idemctl.console.oplog import OperatorLog
from idemctl.errors import IdemctlError
from idemctl.model import Status
from idemctl.operate.documents import item as item_document
from idemctl.operate.targets import Query, Target

COOKIE = "idemctl_session"
LOGIN_COOKIE = "idemctl_login"
PAGE = 50
"""Keys a page of the key list shows."""
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Console:
    """What one console process serves: its target, who may use it and what they may do."""

    target: Target
    shown_url: str
    """The store's URL as pages show it: redacted."""
    users: Users | None
    proxy: Proxy | None
    no_auth: bool
    allow_repair: bool
    oplog: OperatorLog
    secure: bool = False
    """Behind TLS: cookies are ``Secure``."""
    sessions: Sessions = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.sessions is None:
            self.sessions = Sessions()


def make_app(console: Console) -> Starlette:
    pages = Environment(
        loader=PackageLoader("idemctl.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )

    def render(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        session = _session(console, request)
        html = pages.get_template(name).render(
            user=request.state.user, csrf=session.csrf if session else "",
            store=console.shown_url, repair=console.allow_repair, **values,
        )  # fmt: skip
        return HTMLResponse(html, status_code=status)

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def login_form(request: Request, failed: bool = False) -> Response:
        # One token per browser until it logs in: a second login page (another tab, the
        # favicon's redirect) must not void the form already shown.
        token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
        html = pages.get_template("login.html").render(
            csrf=token, failed=failed, next=request.query_params.get("next", "/"), user=None,
            store=console.shown_url, repair=False,
        )  # fmt: skip
        response = HTMLResponse(html, status_code=401 if failed else 200)
        response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict",
                            secure=console.secure, path="/login")  # fmt: skip
        return response

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return login_form(request)
        form = await request.form()
        token = str(form.get("csrf", ""))
        if not token or not secrets.compare_digest(token, request.cookies.get(LOGIN_COOKIE, "")):
            raise HTTPException(403, "the form's token is not this browser's: reload the page")
        user = console.users.check(str(form.get("name", "")), str(form.get("password", ""))) \
            if console.users else None  # fmt: skip
        if user is None:
            return login_form(request, failed=True)
        session = console.sessions.start(user)  # a fresh id: one planted before is worthless
        target = str(form.get("next", "/"))
        response = RedirectResponse(target if target.startswith("/") and not target.startswith("//") else "/", 303)
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="strict", secure=console.secure)
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    async def logout(request: Request) -> Response:
        await _checked_form(console, request)
        console.sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE)
        return response

    def overview(request: Request) -> Response:
        counts = operate.stats(console.target)
        return render(request, "overview.html", counts=counts, now=datetime.now(UTC))

    def keys(request: Request) -> Response:
        query, cursor = _query(request)
        page = next(operate.records(console.target, query, PAGE, cursor))
        return render(request, "keys.html", page=page, query=query, quote=quote,
                      params=dict(request.query_params))  # fmt: skip

    async def key(request: Request) -> Response:
        name = request.path_params["key"]
        revealed = False
        if request.method == "POST":
            await _checked_form(console, request)
            revealed = True
            console.oplog.write(request.state.user.name, "reveal", name, "shown")
        record = operate.inspect(console.target, name)
        document = item_document.document(record, datetime.now(UTC))
        return render(request, "key.html", key=name, record=document, revealed=revealed, quote=quote)

    async def unlock(request: Request) -> Response:
        _may_repair(console, request.state.user)
        name = request.query_params.get("key") or ""
        if request.method == "GET":
            preview = operate.unlock(console.target, name, dry_run=True)
            return render(request, "confirm.html", action="unlock", key=name, preview=preview)
        form = await _checked_form(console, request)
        name = str(form.get("key", ""))
        if form.get("confirm") != name:
            return render(request, "confirm.html", 400, action="unlock", key=name,
                          preview=operate.unlock(console.target, name, dry_run=True),
                          mistyped=True)  # fmt: skip
        try:
            done = operate.unlock(console.target, name)
            result = f"unlocked ({done.count})"
        except IdemctlError as exc:
            result = f"refused: {exc}"
        console.oplog.write(request.state.user.name, "unlock", name, result)
        return RedirectResponse("/log", 303)

    def log(request: Request) -> Response:
        return render(request, "log.html", entries=console.oplog.recent())

    def api_stats(request: Request) -> Response:
        counts = operate.stats(console.target)
        return JSONResponse(_stats_document(console, counts))

    def api_keys(request: Request) -> Response:
        query, cursor = _query(request)
        page = next(operate.records(console.target, query, PAGE, cursor))
        at = datetime.now(UTC)
        return JSONResponse({"items": [item_document.document(r, at) for r in page.items],
                             "cursor": page.cursor})  # fmt: skip

    def api_key(request: Request) -> Response:
        record = operate.inspect(console.target, request.path_params["key"])
        return JSONResponse(item_document.document(record, datetime.now(UTC)))

    routes = [
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview),
        Route("/keys", keys),
        Route("/keys/{key:path}", key, methods=["GET", "POST"]),
        Route("/actions/unlock", unlock, methods=["GET", "POST"]),
        Route("/log", log),
        Route("/api/stats", api_stats),
        Route("/api/keys", api_keys),
        Route("/api/keys/{key:path}", api_key),
        Mount("/static", StaticFiles(packages=[("idemctl.console", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Guard, console=console)],
        exception_handlers={HTTPException: _error, IdemctlError: _idemctl_error},
    )


class _Guard(BaseHTTPMiddleware):
    """Every request: who it is (or the way to the login page), and the security headers."""

    def __init__(self, app: Any, console: Console) -> None:
        super().__init__(app)
        self.console = console

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        request.state.user = _user(self.console, request)
        if request.state.user is None and not _open(path):
            if path.startswith("/api/"):
                response: Response = JSONResponse({"error": "log in first"}, 401)
            else:
                response = RedirectResponse(f"/login?next={quote(path)}", 303)
        else:
            response = await call_next(request)
        response.headers.update(HEADERS)
        return response


def _open(path: str) -> bool:
    return path in ("/login", "/healthz", "/favicon.ico") or path.startswith("/static/")


def _user(console: Console, request: Request) -> User | None:
    if console.no_auth:
        return User("local", OPERATOR)
    if console.proxy is not None:
        client = request.client.host if request.client else None
        vouched = console.proxy.user(client, request.headers, console.users)
        if vouched is not None:
            return vouched
    session = _session(console, request)
    return session.user if session else None


def _session(console: Console, request: Request) -> Session | None:
    return console.sessions.get(request.cookies.get(COOKIE))


async def _checked_form(console: Console, request: Request) -> Any:
    """The request's form, once its CSRF token is the session's (else 403)."""
    form = await request.form()
    session = _session(console, request)
    if console.no_auth or (console.proxy is not None and session is None):
        # No session to hold a token: a proxy's users and --no-auth act on SameSite alone.
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise HTTPException(403, "a form from another site")
        return form
    if session is None or not session.csrf_valid(str(form.get("csrf", "")) or None):
        raise HTTPException(403, "the form's token is not this session's: reload the page")
    return form


def _may_repair(console: Console, user: User) -> None:
    if not console.allow_repair:
        raise HTTPException(403, "this console is read-only: start it with --allow-repair")
    if not user.operator:
        raise HTTPException(403, f"{user.name} is a viewer: only operators may act")


def _query(request: Request) -> tuple[Query, str | None]:
    p = request.query_params
    status = p.get("status") or None
    older = p.get("older_than")
    query = Query(
        status=Status(status) if status else None,
        stale=p.get("stale") == "1",
        released=p.get("released") == "1",
        older_than=float(older) if older else None,
        prefix=p.get("prefix") or None,
    )
    return query, p.get("cursor") or None


def _stats_document(console: Console, counts: Any) -> dict[str, Any]:
    from idemctl.operate.documents import stats as stats_document
    from idemctl.operate.results import Counts

    if isinstance(counts, Counts):
        return stats_document.document({"store": console.shown_url}, counts.stats, counts.at,
                                       counts.entities)  # fmt: skip
    from idemctl.operate.documents import powertools_stats

    return powertools_stats.document({"store": console.shown_url}, counts)


async def _error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": exc.detail}, exc.status_code)
    return PlainTextResponse(f"{exc.status_code}: {exc.detail}", exc.status_code)


async def _idemctl_error(request: Request, exc: Exception) -> Response:
    status = 404 if type(exc).__name__ in ("KeyNotFound", "EntityNotFound") else 400
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc)}, status)
    return PlainTextResponse(str(exc), status)

