"""Who a console request comes from, and what it may do: the login and logout pages, the
middleware that names the user (or sends to the login page) and adds the security headers
to every answer, and the checks a form and an action pass (``auth`` has the users and
sessions themselves)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from idemctl.console.auth import OPERATOR, Session, User
from idemctl.console.pages import PAGES

if TYPE_CHECKING:
    from starlette.requests import Request

    from idemctl.console.app import Console

COOKIE = "idemctl_session"
LOGIN_COOKIE = "idemctl_login"
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
OPEN = ("/login", "/healthz", "/favicon.ico")
"""Paths anyone may ask for (and ``/static/``)."""


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


class Guard(BaseHTTPMiddleware):
    """Every request: who it is (or the way to the login page), and the security headers."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path = request.url.path
        request.state.user = user(request)
        if request.state.user is None and not (path in OPEN or path.startswith("/static/")):
            if path.startswith("/api/"):
                response: Response = JSONResponse({"error": "log in first"}, 401)
            else:
                response = RedirectResponse(f"/login?next={quote(path)}", 303)
        else:
            response = await call_next(request)
        response.headers.update(HEADERS)
        return response


def user(request: Request) -> User | None:
    """The request's user: everyone is the local operator with ``--no-auth``; else the one
    a trusted proxy names, else the one the session cookie names."""
    console = _console(request)
    if console.no_auth:
        return User("local", OPERATOR)
    if console.proxy is not None:
        client = request.client.host if request.client else None
        vouched = console.proxy.user(client, request.headers, console.users)
        if vouched is not None:
            return vouched
    found = session(request)
    return found.user if found else None


def session(request: Request) -> Session | None:
    return _console(request).sessions.get(request.cookies.get(COOKIE))


async def checked_form(request: Request) -> Any:
    """The request's form, once its CSRF token is the session's (else 403)."""
    console = _console(request)
    form = await request.form()
    found = session(request)
    if found is None and (console.no_auth or console.proxy is not None):
        # No session to hold a token: --no-auth and a proxy's users rely on the browser
        # saying where the form came from.
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise HTTPException(403, "a form from another site")
        return form
    if found is None or not found.csrf_valid(str(form.get("csrf", "")) or None):
        raise HTTPException(403, "the form's token is not this session's: reload the page")
    return form


def may_repair(request: Request) -> None:
    """403 unless the console allows repairs and the user is an operator."""
    if not _console(request).allow_repair:
        raise HTTPException(403, "this console is read-only: start it with --allow-repair")
    if not request.state.user.operator:
        raise HTTPException(403, f"{request.state.user.name} is a viewer: only operators may act")


async def login(request: Request) -> Response:
    console = _console(request)
    if request.method == "GET":
        return _login_form(request)
    form = await request.form()
    token = str(form.get("csrf", ""))
    if not token or not secrets.compare_digest(token, request.cookies.get(LOGIN_COOKIE, "")):
        raise HTTPException(403, "the form's token is not this browser's: reload the page")
    name, password = str(form.get("name", "")), str(form.get("password", ""))
    users = console.users
    found = await run_in_threadpool(users.check, name, password) if users else None
    if found is None:
        return _login_form(request, failed=True)
    started = console.sessions.start(found)  # a fresh id: one planted before is worthless
    target = str(form.get("next", "/"))
    safe = target.startswith("/") and not target.startswith(("//", "/\\"))
    response = RedirectResponse(target if safe else "/", 303)
    response.set_cookie(COOKIE, started.id, httponly=True, samesite="strict", secure=console.secure)
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    return response


async def logout(request: Request) -> Response:
    await checked_form(request)
    _console(request).sessions.end(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", 303)
    response.delete_cookie(COOKIE)
    return response


def _login_form(request: Request, failed: bool = False) -> Response:
    console = _console(request)
    # One token per browser until it logs in: a second login page (another tab, the
    # favicon's redirect) must not void the form already shown.
    token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
    html = PAGES.get_template("login.html").render(
        csrf=token, failed=failed, next=request.query_params.get("next", "/"), user=None,
        store=console.where.target.url, repair=False, params={},
    )  # fmt: skip
    response = HTMLResponse(html, status_code=401 if failed else 200)
    response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict",
                        secure=console.secure, path="/login")  # fmt: skip
    return response
