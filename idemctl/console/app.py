"""The console's web app: server-rendered pages and a JSON API over ``idemctl.operate``,
with nothing of its own but who may see and do what (``guard``, ``auth``) and the operator
log.

Each page has its view (``views``, ``actions``): the ``--json`` document of the command
that shows the same thing. ``/PAGE`` renders it through Jinja2 with autoescaping (a key
holding markup shows as text); ``/api/PAGE`` returns it. Store calls run in a worker
thread, so a slow sweep never stalls the other pages or ``/healthz``.
"""

from __future__ import annotations

from collections.abc import Callable
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

from idemctl.console import actions, confirmations, flash, guard, previews, sampler, views
from idemctl.console.auth import Proxy, Sessions, Users
from idemctl.console.known import KNOWN
from idemctl.console.oplog import OperatorLog, OperatorLogUnwritable
from idemctl.console.pages import PAGES
from idemctl.console.security import Security
from idemctl.console.throttle import Throttled, TimedOut
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
    security: Security = field(default_factory=Security)
    """Its Host names, login throttles, the gates on hashing and audits (``security``)."""


View = Callable[[Console, Request], Any]
"""A page's view: (console, request) -> its document (called in a worker thread)."""


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def render(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
    """The page ``name`` for the request's user (its CSRF token in every form)."""
    console = console_of(request)
    session = guard.session(request)
    values.setdefault("flash", flash.FLASHES.get(request.query_params.get("flash")))
    html = PAGES.get_template(name).render(
        user=request.state.user, csrf=session.csrf if session else "",
        logged_in=session is not None and not console.no_auth,
        store=console.where.target.url, layout=console.where.target.layout,
        no_outbox=views.no_outbox(console.where),
        repair=console.allow_repair, params=request.query_params,
        insecure=console.security.insecure, **values,
    )  # fmt: skip
    return HTMLResponse(html, status_code=status)


def page(
    path: str, template: str, view: View, more: View | None = None, keeps_form: bool = False
) -> list[Route]:
    """``path`` rendered by ``template``, and its document at ``/api`` + ``path``. ``more``:
    the page's other values (a dict, for the HTML alone); ``keeps_form``: an error is shown
    on the page itself (``failure``, ``doc`` None), its form still there to correct."""

    async def html(request: Request) -> Response:
        console = console_of(request)
        extra = await run_in_threadpool(more, console, request) if more else {}
        try:
            document = await run_in_threadpool(view, console, request)
        except (HTTPException, IdemctlError) as exc:
            if not keeps_form:
                raise
            status, detail = _status_of(exc)
            answer = render(request, template, status, doc=None, failure=detail, **extra)
            answer.headers.update(getattr(exc, "headers", None) or {})
            return answer
        return render(request, template, doc=document, **extra)

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
    """``inspect --json``, the result masked; POST (the session's ``csrf`` in the form)
    reveals it to an operator, and is logged. A GET or HEAD never reveals: a cross-site
    ``<img>`` can make one."""
    reveal = request.method == "POST"
    if reveal:
        await guard.checked_form(request)
    elif request.query_params.get("reveal"):
        raise HTTPException(400, "a result is revealed by POST /api/keys/KEY, with the "
                            "session's csrf token in the form; never by GET")  # fmt: skip
    return JSONResponse(await run_in_threadpool(_key, console_of(request), request, reveal))


def _key(console: Console, request: Request, reveal: bool) -> dict[str, Any]:
    name = request.path_params["key"]
    if reveal and not request.state.user.operator:
        raise HTTPException(403, f"{request.state.user.name} is a viewer: results stay masked")
    document = views.key(console.where, name, reveal)
    if reveal:  # a key that is not there reveals nothing; else no line, nothing shown
        console.oplog.write(request.state.user.name, "reveal", name, "shown", kind="key",
                            address=request.state.address)  # fmt: skip
    return document


async def act(request: Request) -> Response:
    """An action: its dry run (GET), or, confirmed (POST) with the preview its dry run
    handed out, the action on what that dry run showed, logged (``confirmations``)."""
    console = console_of(request)
    chosen = actions.act(request.path_params["name"])
    api = request.url.path.startswith("/api/")
    guard.may_repair(request)
    user = request.state.user.name

    def answer(
        shown: confirmations.Preview | confirmations.Refusal, asked: Any, status: int
    ) -> Response:
        if api:
            return JSONResponse(shown.to_json(), status)
        refusal = shown if isinstance(shown, confirmations.Refusal) else None
        return render(request, "confirm.html", status, act=chosen, asked=asked, refusal=refusal,
                      shown=refusal.preview if refusal else shown, done=None)  # fmt: skip

    if request.method != "POST":
        asked = previews.asked_of(request.query_params, chosen.bulk)
        found = await run_in_threadpool(confirmations.preview, chosen, console.where, asked, user)
        return answer(found, asked, 200)
    form = await guard.checked_form(request)
    asked = previews.asked_of(form, chosen.bulk)
    typed, token = str(form.get("confirm", "")), str(form.get("preview", ""))
    plan = await run_in_threadpool(
        confirmations.confirmed, chosen, console.where, asked, user, typed, token
    )
    if isinstance(plan, confirmations.Refusal):
        return answer(plan, asked, plan.status)
    address = request.state.address
    started = await run_in_threadpool(  # no line, no action: OperatorLogUnwritable is a 503
        confirmations.log_before, console.oplog, plan, address
    )
    done = await run_in_threadpool(confirmations.perform, plan, console.where)
    logged = await run_in_threadpool(confirmations.log_after, console.oplog, started, plan, done)
    if isinstance(done, confirmations.Refusal):
        return answer(done, asked, done.status)
    if api:
        entries: list[dict[str, Any] | None] = [*logged.entries] or [None]
        return JSONResponse({**done.to_json(), "logged": entries[0], "logged_keys": entries[1:],
                             **({"log_error": logged.error} if logged.error else {})})  # fmt: skip
    if done.whole and not logged.error:
        return RedirectResponse(flash.after(chosen, asked, done.result, user), 303)
    return render(request, "confirm.html", act=chosen, asked=asked, refusal=None, shown=None,
                  done=done, log_error=logged.error)  # fmt: skip


def _audit(console: Console, request: Request) -> dict[str, Any] | None:
    """An audit when the form named a group or a topic; else nothing yet."""
    if not request.query_params.get("group") and not request.query_params.get("topic"):
        if request.url.path.startswith("/api/"):
            raise OptionError("group", "an audit needs ?group=G&topic=T")
        return None
    security = console.security
    if not security.brokers:  # else it tries 127.0.0.1:9092 for half a minute
        raise HTTPException(409, "no Kafka brokers are configured: start the console with "
                            "--brokers HOST:PORT (or kafka: bootstrap.servers in idemctl.yaml) "
                            "to audit")  # fmt: skip
    try:
        return security.audits.run(lambda: views.audit(console.where, request.query_params),
                                   "idemctl-console-audit")  # fmt: skip
    except Throttled as exc:
        raise HTTPException(
            429, f"{security.audits.at_once} audits are running: try again in {exc.retry_after} s",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None  # fmt: skip
    except TimedOut as exc:
        raise HTTPException(
            504, f"the audit did not finish within {exc.seconds:g} s: do the brokers at "
            f"{console.where.brokers} answer? (it goes on until Kafka's own timeout)",
        ) from None  # fmt: skip


def _keys(console: Console, request: Request) -> dict[str, Any]:
    return views.keys(console.where, request.query_params)


def _entities(console: Console, request: Request) -> dict[str, Any]:
    return views.entities(console.where, request.query_params)


def _tasks(console: Console, request: Request) -> dict[str, Any]:
    return views.tasks(console.where, request.query_params)


def _overview(console: Console, request: Request) -> dict[str, Any]:
    """``stats`` and ``doctor``, and the last hour as this console sampled it."""
    history = getattr(request.app.state, "history", None)
    return {**views.overview(console.where), "history": history.document() if history else None}


def _outbox(console: Console, request: Request) -> dict[str, Any] | None:
    """``outbox status --json``; on a store without an outbox the page says why (the
    ``/api/`` document is the error)."""
    if views.no_outbox(console.where) and not request.url.path.startswith("/api/"):
        return None
    return views.outbox(console.where)


def _outbox_rows(console: Console, request: Request) -> dict[str, Any]:
    """The page's rows: the oldest unpublished and failing ones (none without an outbox)."""
    if views.no_outbox(console.where):
        return {"rows": None}
    return {"rows": views.outbox_rows(console.where)}


async def _api_outbox_rows(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(views.outbox_rows, console_of(request).where))


def _known(console: Console, request: Request) -> dict[str, Any]:
    """The groups and topics the brokers list, for the audit form (none asked for without
    configured brokers)."""
    brokers = console.where.brokers if console.security.brokers else None
    return {"known": KNOWN.get(brokers, console.where.kafka_config)}


def _lost(console: Console, request: Request) -> dict[str, Any]:
    """What is known of a key an audit called lost: its record if any, the message the
    audit linked (the query's group, topic, partition and offset), the log's lines on it."""
    return views.lost(
        console.where, request.path_params["key"], request.query_params,
        [e.to_json() for e in console.oplog.recent()],
    )  # fmt: skip


def _oplog(console: Console, request: Request) -> dict[str, Any]:
    return {"entries": [e.to_json() for e in console.oplog.recent()]}


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def error(request: Request, exc: Exception) -> Response:
    """An error as JSON under ``/api/``, else a page (escaped, as everything), with its
    headers (``Retry-After``); a refusal (403, 429) is written to the operator log."""
    status, detail = _status_of(exc)
    headers = dict(getattr(exc, "headers", None) or {})
    if status in (403, 429):
        await guard.refused(request, status, detail)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": detail}, status, headers=headers)
    if getattr(request.state, "user", None) is None:
        return PlainTextResponse(f"{status}: {detail}", status, headers=headers)
    answer = render(request, "error.html", status, code=status, detail=detail)
    answer.headers.update(headers)
    return answer


def _status_of(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, KeyNotFound | EntityNotFound):
        return 404, str(exc)
    if isinstance(exc, StoreUnavailable | OperatorLogUnwritable):
        return 503, str(exc)
    return 400, str(exc)


def make_app(console: Console) -> Starlette:
    """The console's ASGI app."""
    routes = [
        Route("/healthz", healthz),
        Route("/login", guard.login, methods=["GET", "POST"]),
        Route("/logout", guard.logout, methods=["POST"]),
        *page("/", "overview.html", _overview),
        *page("/keys", "keys.html", _keys, keeps_form=True),
        *page("/lost/{key:path}", "lost.html", _lost),
        Route("/keys/{key:path}", key, methods=["GET", "POST"]),
        Route("/api/keys/{key:path}", api_key, methods=["GET", "POST"]),
        *page("/entities", "entities.html", _entities, keeps_form=True),
        *page(
            "/entities/{entity:path}",
            "entity.html",
            lambda c, r: views.entity(c.where, r.path_params["entity"]),
        ),
        *page("/tasks", "tasks.html", _tasks, keeps_form=True),
        *page("/outbox", "outbox.html", _outbox, more=_outbox_rows, keeps_form=True),
        Route("/api/outbox/rows", _api_outbox_rows),
        *page("/audit", "audit.html", _audit, more=_known, keeps_form=True),
        *page("/log", "log.html", _oplog),
        Route("/actions/{name}", act, methods=["GET", "POST"]),
        Route("/api/actions/{name}", act, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(packages=[("idemctl.console", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(guard.RequestGuard)],
        lifespan=sampler.lifespan,
        exception_handlers={HTTPException: error, IdemctlError: error},
    )
    app.state.console = console
    return app


def serve(console: Console, host: str, port: int) -> None:
    """Serve ``console`` with uvicorn until SIGTERM or Ctrl-C."""
    import uvicorn

    # No proxy headers: uvicorn would believe X-Forwarded-For from 127.0.0.1 and make any
    # local process "the proxy"; the console alone decides that, by the TCP peer.
    uvicorn.run(make_app(console), host=host, port=port, log_level="warning",
                proxy_headers=False, server_header=False)  # fmt: skip
