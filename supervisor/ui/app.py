"""The UI's Starlette app: its pages, its `/api/` twins, and the cancel and resume forms.

`create_app(backend)` builds it over a backend the caller opened (and closes): the `ui` command
serves it with uvicorn, tests drive it with Starlette's TestClient. GET never changes anything;
cancel and resume are a GET of a confirmation form, then its POST, checked by `guard`.

Starlette runs these plain functions in a thread pool, and a backend is one connection, so every
ledger call goes through `Ledger.lock`: one call at a time, as the CLI makes them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from typing import Optional
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..cli.payloads import shown
from ..cli.show import describe_wait, error_lines
from ..humane import format_time, queue_cells
from ..ledger.errors import ExecutionConflict, InvalidArgument, UnknownExecution, YieldstarError
from ..ledger.values import TERMINAL_STATUSES, ExecutionStatus
from . import guard, reads, timeline

# What the page says after a cancel or resume (`?done=`): fixed texts, never the query's own.
DONE = {
    "cancelled": "Cancelled.",
    "unchanged": "It had already ended: nothing changed.",
    "resumed": "Resumed: it is due now.",
}

# The largest confirmation form read: a token and a reason of a few lines.
FORM_BYTES = 64 * 1024


class Ledger:
    """The open backend, one call at a time (see the module docstring)."""

    def __init__(self, backend):
        self.backend = backend
        self.lock = threading.Lock()


def create_app(backend, *, allowed_hosts: Optional[frozenset[str]] = guard.LOOPBACK_NAMES,
               token: Optional[str] = None):
    """The UI over `backend`: an ASGI app.

    Args:
        backend: an open ledger backend; the caller closes it.
        allowed_hosts: the Host names answered (`guard.hosts_for`); None: any.
        token: the CSRF token of the forms (default: a new random one).
    """
    ledger = Ledger(backend)
    csrf = token or guard.new_token()
    pages = _templates()

    def html(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
        body = pages.get_template(name).render(request=request, path=request.url.path, **context)
        return HTMLResponse(body, status_code=status_code)

    def refused(request: Request, message: str, status_code: int) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status_code)
        return html(request, "message.html", status_code, title="Refused" if status_code == 403 else "Not done",
                    message=message)

    def api(text: str) -> Response:
        return Response(text, media_type="application/json")

    def executions_page(request: Request) -> Response:
        filters = reads.Filters.from_query(request.query_params)
        with ledger.lock:
            now, records = reads.read_executions(ledger.backend, filters)
        if request.url.path.startswith("/api/"):
            return api(reads.executions_json(records))
        more = len(records) == filters.limit and filters.limit > 0
        return html(request, "executions.html", title="Executions", now=now, records=records, filters=filters,
                    statuses=[s.value for s in ExecutionStatus],
                    next_query=urlencode(filters.query(offset=filters.offset + filters.limit)) if more else None,
                    previous_query=urlencode(filters.query(offset=max(filters.offset - filters.limit, 0)))
                    if filters.offset else None)

    def execution_page(request: Request) -> Response:
        view = read_view(request.path_params["execution_id"])
        if request.url.path.startswith("/api/"):
            return api(reads.execution_json(view))
        return html(request, "execution.html", title=view.record.execution_id, view=view, now=view.now,
                    record=view.record, rows=_record_rows(view), waits=[describe_wait(w, view.now) for w in view.waiting],
                    timeline=timeline.lay_out(view.history, view.now), colours=timeline.COLOURS,
                    actions=_actions(view), done=DONE.get(request.query_params.get("done", "")))

    def read_view(execution_id: str) -> reads.ExecutionView:
        with ledger.lock:
            view = reads.read_execution(ledger.backend, execution_id)
        if view is None:
            raise UnknownExecution(f"no execution {execution_id!r}")
        return view

    def confirm(request: Request, verb: str) -> Response:
        """The confirmation form: what will be done to which execution, and a button."""
        view = read_view(request.path_params["execution_id"])
        return html(request, "confirm.html", title=f"{verb.title()} {view.record.execution_id}?", verb=verb,
                    record=view.record, now=view.now, token=csrf)

    def act(request: Request, verb: str, form: dict) -> Response:
        """The confirmed form's POST: checked by `guard`, then the call `yieldstar cancel` or
        `resume` makes; back to the execution's page."""
        why = guard.post_refusal(request.headers, form.get("csrf_token"), csrf, request.url.scheme)
        if why is not None:
            return refused(request, why, 403)
        execution_id = request.path_params["execution_id"]
        with ledger.lock:
            executions = ledger.backend.executions
            before = executions.get(execution_id)
            if before is None:
                raise UnknownExecution(f"no execution {execution_id!r}")
            if verb == "cancel":
                executions.cancel(execution_id, reason=form.get("reason", "").strip() or None)
                done = "unchanged" if before.status in TERMINAL_STATUSES else "cancelled"
            else:
                executions.resume(execution_id)
                done = "resumed"
        return RedirectResponse(f"/executions/{quote(execution_id, safe='')}?done={done}", status_code=303)

    def action(verb: str):
        async def endpoint(request: Request) -> Response:
            if request.method == "GET":
                return await run_in_threadpool(confirm, request, verb)
            fields = await _form_fields(request)
            if fields is None:
                return refused(request, f"the form must be urlencoded and at most {FORM_BYTES} bytes", 400)
            return await run_in_threadpool(act, request, verb, fields)
        return endpoint

    def listing(read, to_json, template: str, title: str):
        """A page listing what `read(backend)` returns (`(now, items)`), and its JSON twin."""
        def page(request: Request) -> Response:
            with ledger.lock:
                now, items = read(ledger.backend)
            if request.url.path.startswith("/api/"):
                return api(to_json(items))
            return html(request, template, title=title, now=now, items=items)
        return page

    queues_page = listing(reads.read_queues, reads.queues_json, "queues.html", "Queues")
    schedules_page = listing(reads.read_schedules, reads.schedules_json, "schedules.html", "Schedules")
    supervisors_page = listing(reads.read_supervisors, reads.supervisors_json, "supervisors.html", "Live supervisors")

    routes = [
        Route("/", executions_page),
        Route("/api/executions", executions_page),
        Route("/executions/{execution_id:path}", execution_page),
        Route("/api/executions/{execution_id:path}", execution_page),
        Route("/cancel/{execution_id:path}", action("cancel"), methods=["GET", "POST"]),
        Route("/resume/{execution_id:path}", action("resume"), methods=["GET", "POST"]),
        Route("/queues", queues_page),
        Route("/api/queues", queues_page),
        Route("/schedules", schedules_page),
        Route("/api/schedules", schedules_page),
        Route("/supervisors", supervisors_page),
        Route("/api/supervisors", supervisors_page),
    ]
    app = Starlette(routes=routes)

    # Errors as answers: bad input 400, an unknown execution 404, a resume of an execution that
    # is not failed, cancelled nor parked 409, the ledger failing 503 (most specific first).
    for error, status_code in ((UnknownExecution, 404), (ExecutionConflict, 409), (InvalidArgument, 400),
                               (YieldstarError, 503)):
        app.add_exception_handler(error, _answer(refused, status_code))

    return Guarded(app, allowed_hosts)


class Guarded:
    """ASGI middleware: a request whose Host is not one the UI answers gets a 403 (`guard`), and
    every answer carries `guard.HEADERS` (no framing, nothing loaded from elsewhere)."""

    def __init__(self, app, allowed_hosts: Optional[frozenset[str]]):
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if not guard.host_allowed(host, self.allowed_hosts):
            response = PlainTextResponse(f"this UI does not answer requests for host {host!r}", status_code=403,
                                         headers=guard.HEADERS)
            await response(scope, receive, send)
            return

        async def send_guarded(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *GUARD_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_guarded)


GUARD_HEADERS = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in guard.HEADERS.items()]


async def _form_fields(request: Request) -> Optional[dict]:
    """The fields of a small urlencoded form (the confirmation's; no body: no fields), the first of
    each name; None for another kind of body or a larger one. Read here rather than with `request.form()`, which
    needs python-multipart for a form this simple."""
    if request.headers.get("content-type", "").split(";")[0].strip() not in ("application/x-www-form-urlencoded", ""):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        return None
    fields: dict = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields


def _answer(refused, status_code: int):
    async def handler(request: Request, exc: Exception) -> Response:
        message = str(exc) if status_code != 503 else f"the ledger could not be used: {exc}"
        return refused(request, message, status_code)
    return handler


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("supervisor.ui", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = lambda ms, now=None: format_time(ms, now=now)
    env.filters["path"] = lambda text: quote(text, safe="")
    env.globals["shown"] = lambda text: shown(text, False)
    env.filters["queue_cells"] = queue_cells
    return env


def _record_rows(view: reads.ExecutionView) -> list[tuple[str, str]]:
    """The record as `get` shows it: a label and a text per field; times local with a hint,
    payloads cut short when long, the error as its lines."""
    rows = []
    for key, value in asdict(view.record).items():
        if key == "deadline_at" and value is None:
            continue
        if key in ("due_at", "lease_expires_at", "created_at", "updated_at", "deadline_at"):
            text = format_time(value, now=view.now)
        elif key == "error_json" and value is not None and isinstance(json.loads(value), dict):
            text = "\n".join(error_lines(json.loads(value)))
        elif key.endswith("_json"):
            text = shown(value, False)
        else:
            text = "(none)" if value is None else str(value)
        rows.append((key[: -len("_json")] if key.endswith("_json") else key, text))
    return rows


def _actions(view: reads.ExecutionView) -> list[str]:
    """What may be done to it: cancel while not ended; resume when failed, cancelled or parked."""
    status = view.record.status
    parked = any(w.kind == "code" for w in view.waiting)
    actions = [] if status in TERMINAL_STATUSES else ["cancel"]
    if status in ("failed", "cancelled") or parked:
        actions.append("resume")
    return actions
