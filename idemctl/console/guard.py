"""Who a console request comes from, and what it may do: the middleware that answers only
the console's own ``Host`` names, names the user (or sends to the login page), refuses a
state-changing request from another origin and adds the security headers to every answer
(an unexpected error's too); the login and logout pages; the checks a form and an action
pass (``auth`` has the users and sessions themselves, ``security`` the limits)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from idemctl.console.auth import OPERATOR, Session, User
from idemctl.console.oplog import ANONYMOUS, OperatorLogUnwritable
from idemctl.console.pages import PAGES
from idemctl.console.throttle import Throttled

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
    # Not no-referrer: under it a browser sends "Origin: null" with the console's own forms.
    # same-origin sends the origin (and a Referer) to the console itself, nothing elsewhere.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
OPEN = ("/login", "/healthz", "/favicon.ico")
"""Paths anyone may ask for (and ``/static/``)."""
SAFE = ("GET", "HEAD", "OPTIONS")
"""Methods that change nothing; every other one is checked for where it comes from."""
NAME_LENGTH = 200
"""Characters of a login name that are read (and logged)."""
log = logging.getLogger("idemctl.console")


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


class RequestGuard(BaseHTTPMiddleware):
    """Every request: a name of the console's own (else 421), who it is (or the way to the
    login page), a POST from the console's own origin (else 403), and the security
    headers on whatever answers, an unexpected error included."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        console = _console(request)
        path = request.url.path
        request.state.user = None
        request.state.address = address(request)
        host = request.headers.get("host")
        if path != "/healthz" and not console.security.hosts.allows(
            host, request.scope.get("server")
        ):
            response = await _foreign(request, host or "")
        else:
            if console.users is not None and console.users.due():
                for name in await run_in_threadpool(console.users.refresh):
                    console.sessions.end_user(name)  # removed, or its password changed
            request.state.user = user(request)
            why = None if request.method in SAFE else elsewhere(request)
            if why is not None:
                await refused(request, 403, why)
                response = _answer(request, 403, why)
            elif request.state.user is None and not (path in OPEN or path.startswith("/static/")):
                if path.startswith("/api/"):
                    response = JSONResponse({"error": "log in first"}, 401)
                else:
                    response = RedirectResponse(f"/login?next={quote(path)}", 303)
            else:
                response = await _guarded(request, call_next)
        response.headers.update(HEADERS)
        return response


async def _guarded(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    try:
        return await call_next(request)
    except OperatorLogUnwritable as exc:
        log.error("%s", exc)
        return _answer(request, 503, str(exc))
    except Exception:
        log.exception("the console failed on %s %s", request.method, request.url.path)
        return _answer(request, 500, "the console failed: its log says why")


def _answer(request: Request, status: int, detail: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": detail}, status)
    return PlainTextResponse(f"{status}: {detail}", status)


async def _foreign(request: Request, host: str) -> Response:
    """421 for a ``Host`` the console does not answer to; logged once a name."""
    console = _console(request)
    shown = host[:NAME_LENGTH]
    first, overflow = console.security.foreign.first(shown)
    if first:
        target = "(more names: no longer logged)" if overflow else shown
        await write(request, "refused", target, "421: not a Host name of this console",
                    kind="host", required=False)  # fmt: skip
    return PlainTextResponse(
        "421: this console does not answer to that name. If it is the console's own, "
        "start it with --allowed-host NAME.", 421,
    )  # fmt: skip


def address(request: Request) -> str:
    """The client's address: the TCP peer's (uvicorn believes no forwarded header), or
    what a trusted proxy says it is."""
    console = _console(request)
    peer = request.client.host if request.client else None
    if console.proxy is not None:
        return console.proxy.address_of(peer, request.headers)
    return peer or "-"


def elsewhere(request: Request) -> str | None:
    """Why a state-changing request comes from another site, or None: a browser says
    where a request comes from (``Sec-Fetch-Site``, ``Origin``); a client that says
    nothing (a script) has only its session's token to show."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a request from another site ({site[:40]})"
    origin = request.headers.get("origin")
    if origin is not None:
        hosts = _console(request).security.hosts
        if not hosts.own_origin(origin, request.headers.get("host")):
            return "a request from another origin"
    return None


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


async def write(
    request: Request,
    action: str,
    target: str,
    result: str,
    *,
    kind: str = "key",
    required: bool = True,
    user: str | None = None,
) -> None:
    """A line of the operator log for ``request`` (its user and address). ``required``:
    ``OperatorLogUnwritable`` when it cannot be written (do not go on); else a warning."""
    known = getattr(request.state, "user", None)
    name = user or (known.name if known is not None else ANONYMOUS)
    oplog = _console(request).oplog
    try:
        await run_in_threadpool(oplog.write, name, action, target, result, kind=kind,
                                address=getattr(request.state, "address", None))  # fmt: skip
    except OperatorLogUnwritable as exc:
        if required:
            raise
        log.warning("%s", exc)


async def refused(request: Request, status: int, detail: str) -> None:
    """A refusal in the operator log: a user's each time, a stranger's (no login) up to
    ``REFUSALS_LOGGED`` per address in a while."""
    if getattr(request.state, "user", None) is None:
        window = _console(request).security.refusals
        where = getattr(request.state, "address", "-")
        if window.wait(where):
            return
        window.add(where)
    await write(request, "refused", f"{request.method} {request.url.path}",
                f"{status}: {detail}", kind="path", required=False)  # fmt: skip


async def checked_form(request: Request) -> Any:
    """The request's form, once its CSRF token is the session's (else 403). Without a
    session (``--no-auth``, a proxy's users) the middleware's origin checks are all."""
    console = _console(request)
    form = await request.form()
    found = session(request)
    sessionless = console.no_auth or console.proxy is not None
    if found is None and sessionless and request.state.user is not None:
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
    security = console.security
    if request.method == "GET":
        return _login_form(request)
    form = await request.form()
    token = str(form.get("csrf", ""))
    if not (
        token
        and secrets.compare_digest(token, request.cookies.get(LOGIN_COOKIE, ""))
        and security.tokens.valid(token)
    ):  # a pair chosen elsewhere: the console signs the tokens it hands out
        raise HTTPException(403, "the form's token is not one this console gave: reload the page")
    name, password = str(form.get("name", ""))[:NAME_LENGTH], str(form.get("password", ""))
    where = request.state.address
    wait = security.logins.wait(name, where)
    if wait:
        raise HTTPException(429, f"too many failed logins: try again in {wait} s",
                            headers={"Retry-After": str(wait)})  # fmt: skip
    users = console.users
    try:
        async with security.hashing:
            found = await run_in_threadpool(users.check, name, password) if users else None
    except Throttled as exc:
        raise HTTPException(429, "too many logins at once: try again in a moment",
                            headers={"Retry-After": str(exc.retry_after)}) from None  # fmt: skip
    if found is None:
        security.logins.failed(name, where)
        known = users is not None and users.role_of(name) is not None
        # An unknown name is not written: it may be a password typed in the wrong field.
        await write(request, "login", name if known else "",
                    "failed" if known else "failed: no such user", kind="user",
                    required=False, user=ANONYMOUS)  # fmt: skip
        return _login_form(request, failed=True)
    security.logins.succeeded(name)
    await write(request, "login", found.name, "ok", kind="user", user=found.name)  # else 503
    # A fresh id: one planted before is worthless; this browser's old session ends.
    started = console.sessions.start(found, replacing=request.cookies.get(COOKIE))
    target = str(form.get("next", "/"))
    safe = target.startswith("/") and not target.startswith(("//", "/\\"))
    response = RedirectResponse(target if safe else "/", 303)
    response.set_cookie(COOKIE, started.id, httponly=True, samesite="strict", secure=console.secure)
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    return response


async def logout(request: Request) -> Response:
    """The session ends, whether or not its line can be written (a logout is never
    refused)."""
    await checked_form(request)
    console = _console(request)
    found = session(request)
    if found is not None:
        await write(request, "logout", found.user.name, "ok", kind="user", required=False)
    console.sessions.end(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", 303)
    response.delete_cookie(COOKIE)
    return response


def _login_form(request: Request, failed: bool = False) -> Response:
    console = _console(request)
    # One token per browser until it logs in: a second login page (another tab, the
    # favicon's redirect) must not void the form already shown. Only one this console
    # signed, and not too old, is kept.
    kept = request.cookies.get(LOGIN_COOKIE) or ""
    token = kept if console.security.tokens.valid(kept) else console.security.tokens.issue()
    html = PAGES.get_template("login.html").render(
        csrf=token, failed=failed, next=request.query_params.get("next", "/"), user=None,
        store="", repair=False, params={},
    )  # fmt: skip  # nothing of the store before a login
    response = HTMLResponse(html, status_code=401 if failed else 200)
    response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="strict",
                        secure=console.secure, path="/login")  # fmt: skip
    return response
