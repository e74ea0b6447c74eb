"""`yieldstar ui`: a local web UI over the ledger (SPEC section 13).

Server-rendered HTML and the same data as JSON under `/api/`, read from one open backend:

    browser --GET /, /executions/ID, /queues ...--> app.py --reads.py--> backend (SQLite or PostgreSQL)
            --GET /api/...---------------------->        (JSON: the CLI's `--json` shapes)
            --POST /executions/ID/cancel|resume--> guard.py (Host, Origin, CSRF token)
                                                   --> executions.cancel / resume, as the CLI calls them

`timeline.py` lays an execution's lease history out as bars for the page's inline SVG. Nothing
here is imported outside the `ui` command: Starlette, Jinja2 and uvicorn are the `ui` extra
(`pip install 'yieldstar[ui]'`), and the plain install and a worker's start never load them.
"""
