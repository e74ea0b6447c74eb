"""`yieldstar ui`'s pages and `/api/` against a real ledger on both backends (Starlette's
TestClient over the app built on an open backend): what each shows, that GET changes nothing,
and that cancel and resume need the form's token and this UI's own origin."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from supervisor import open_backend
from supervisor.ui.app import create_app
from supervisor.ui.timeline import COLOURS

ORIGIN = "http://127.0.0.1:8080"


@pytest.fixture
def client(story):
    with open_backend(story, create=False) as backend:
        with TestClient(create_app(backend), base_url=ORIGIN) as client:
            yield client


def ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [record["execution_id"] for record in response.json()]


@pytest.mark.timeout(120)
def test_the_executions_list_takes_the_ls_filters(client):
    assert ids(client.get("/api/executions")) == ["mail-1", "report-7", "order-1003", "order-1002", "order-1001"]
    assert ids(client.get("/api/executions?status=failed")) == ["order-1002"]
    assert ids(client.get("/api/executions?status=running")) == ["order-1003"]
    assert ids(client.get("/api/executions?workflow=report")) == ["report-7"]
    assert ids(client.get("/api/executions?id_prefix=order-&limit=2&offset=1")) == ["order-1002", "order-1001"]
    assert ids(client.get("/api/executions?since=90s")) == ["mail-1", "report-7", "order-1003"]
    assert ids(client.get("/api/executions?until=90s")) == ["order-1002", "order-1001"]
    record = client.get("/api/executions?id_prefix=order-1001").json()[0]
    assert (record["status"], record["input"], record["result"]) == ("completed", {"sku": "A-7", "qty": 2},
                                                                    {"charged": 2})

    page = client.get("/?status=failed")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'href="/executions/order-1002"' in page.text and "order-1001" not in page.text
    assert '<option value="failed" selected>' in page.text
    assert "older →" in client.get("/?limit=2").text  # a full page links to the next


@pytest.mark.timeout(120)
@pytest.mark.parametrize("query, named", [("status=bogus", "status 'bogus'"), ("limit=-1", "limit '-1'"),
                                          ("offset=x", "offset 'x'"), ("since=yesterday-ish", "since"),
                                          ("workflow=%01", "workflow")])
def test_a_bad_filter_is_refused_by_name(client, query, named):
    api = client.get(f"/api/executions?{query}")
    assert api.status_code == 400 and named in api.json()["error"]
    page = client.get(f"/?{query}")
    assert page.status_code == 400 and named in page.text.replace("&#39;", "'")


@pytest.mark.timeout(120)
def test_an_execution_shows_its_steps_waits_and_lease_timeline(client):
    detail = client.get("/api/executions/order-1001").json()
    assert detail["execution"]["status"] == "completed" and detail["execution"]["waiting_for"] == []
    assert [(s["step_key"], s["attempt"], s["done"]) for s in detail["steps"]] == [("charge", 1, True)]
    first, second = detail["history"]
    assert (first["token"], first["ended_by"], first["renewals"]) == (1, "superseded", 1)
    assert (second["token"], second["ended_by"], second["outcome"]) == (2, "acknowledged", "completed")
    assert first["holder"] != second["holder"]  # the frozen holder was another process
    assert first["ended_at"] < second["claimed_at"]  # nobody held it in between

    page = client.get("/executions/order-1001").text
    svg = page[page.index('<svg class="timeline"'):page.index("</svg>")]
    bars = re.findall(r'<g class="delivery (\w+)" data-token="(\d+)">.*?<rect x="([\d.]+)" y="\d+" width="([\d.]+)"'
                      r'[^>]*fill="([^"]+)"', svg, re.S)
    assert [(ended, token, fill) for ended, token, _, _, fill in bars] == [
        ("superseded", "1", COLOURS["superseded"]), ("acknowledged", "2", COLOURS["acknowledged"])]
    (_, _, x1, w1, _), (_, _, x2, _, _) = bars
    assert float(x1) + float(w1) < float(x2)  # the lapsed lease ends before its successor's claim
    assert f"token 1 · {first['holder']} · superseded" in svg and "↻1" in svg
    assert '<g class="gap"><title>no holder for ' in svg  # the lapsed lease's expiry to the next claim
    assert f"token 2 · {second['holder']} · acknowledged (completed)" in svg
    assert "charge" in page and "{&#34;charged&#34;: 2}" in page

    waiting = client.get("/api/executions/report-7").json()["execution"]
    assert [w["kind"] for w in waiting["waiting_for"]] == ["due"] and waiting["served"] is False
    report = client.get("/executions/report-7").text
    assert "a supervisor to claim it" in report and "No live supervisor serves workflow" in report
    live = client.get("/executions/order-1003").text
    assert '<g class="delivery live" data-token="1">' in live and ">now</text>" in live
    assert 'href="/cancel/order-1003"' in live and 'href="/resume/order-1003"' not in live
    assert 'href="/resume/order-1002"' in client.get("/executions/order-1002").text

    assert client.get("/api/executions/nobody").json() == {"error": "no execution 'nobody'"}
    assert client.get("/executions/nobody").status_code == 404


@pytest.mark.timeout(120)
def test_queues_schedules_and_supervisors(client):
    queues = {q["name"]: q for q in client.get("/api/queues").json()}
    assert queues["emails"]["concurrency"] == 2 and queues["emails"]["due"] == 1
    assert queues["default"]["running"] == 1
    assert '<td>emails</td><td class="num">2</td>' in client.get("/queues").text
    (schedule,) = client.get("/api/schedules").json()
    assert (schedule["name"], schedule["spec"], schedule["last_id"]) == ("nightly", "every 3600s", None)
    assert "every 3600s" in client.get("/schedules").text
    (supervisor,) = client.get("/api/supervisors").json()
    assert (supervisor["id"], supervisor["workflows"]) == ("vm:42:abc", ["order"])
    assert "vm:42:abc" in client.get("/supervisors").text


@pytest.mark.timeout(120)
def test_get_changes_nothing(story, client, db_snapshot):
    before = db_snapshot(story)
    for path in ("/", "/?status=running", "/executions/order-1003", "/cancel/order-1003", "/resume/order-1002",
                 "/cancel/order-1001", "/queues", "/schedules", "/supervisors", "/api/executions",
                 "/api/executions/order-1003", "/api/queues", "/api/schedules", "/api/supervisors"):
        assert client.get(path).status_code == 200, path
    assert db_snapshot(story) == before


def form_token(client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200 and f'<form method="post" action="{path}">' in page.text
    return re.search(r'name="csrf_token" value="([^"]+)"', page.text)[1]


@pytest.mark.timeout(120)
def test_cancel_and_resume_need_the_token_and_this_origin(story, client, db_snapshot):
    token = form_token(client, "/cancel/order-1003")
    before = db_snapshot(story)
    refusals = [
        ({}, {"Origin": ORIGIN}),  # no token
        ({"csrf_token": "guessed"}, {"Origin": ORIGIN}),
        ({"csrf_token": token}, {"Origin": "http://evil.example"}),
        ({"csrf_token": token}, {"Referer": "http://evil.example/page"}),
        ({"csrf_token": token}, {"Origin": ORIGIN, "Sec-Fetch-Site": "cross-site"}),
    ]
    for path in ("/cancel/order-1003", "/resume/order-1002"):
        for form, headers in refusals:
            refused = client.post(path, data=form, headers=headers, follow_redirects=False)
            assert refused.status_code == 403, (path, form, headers, refused.text)
    assert db_snapshot(story) == before

    done = client.post("/cancel/order-1003", data={"csrf_token": token, "reason": "wrong sku"},
                       headers={"Origin": ORIGIN}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, "/executions/order-1003?done=cancelled")
    assert "Cancelled." in client.get(done.headers["location"]).text
    resumed = client.post("/resume/order-1002", data={"csrf_token": form_token(client, "/resume/order-1002")},
                          headers={"Origin": ORIGIN}, follow_redirects=False)
    assert resumed.status_code == 303
    with open_backend(story, create=False) as backend:
        cancelled = backend.executions.get("order-1003")
        assert cancelled.status == "cancelled" and '"wrong sku"' in cancelled.error_json
        assert backend.executions.get("order-1002").status == "admitted"
        assert backend.executions.history("order-1003")[-1].ended_by == "cancelled"

    before = db_snapshot(story)
    conflict = client.post("/resume/order-1001", data={"csrf_token": token}, headers={"Origin": ORIGIN})
    assert conflict.status_code == 409 and "completed" in conflict.text
    unknown = client.post("/cancel/nobody", data={"csrf_token": token}, headers={"Origin": ORIGIN})
    assert unknown.status_code == 404
    assert db_snapshot(story) == before


@pytest.mark.timeout(120)
def test_only_loopback_names_are_answered(client):
    """A page on another site whose name resolves to 127.0.0.1 (DNS rebinding) sends its own
    name as the Host: it can read nothing, not even a form's token."""
    for path in ("/", "/api/executions", "/cancel/order-1003"):
        assert client.get(path, headers={"Host": "evil.example:8080"}).status_code == 403
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert client.get("/api/queues", headers={"Host": host}).status_code == 200


@pytest.mark.timeout(120)
def test_no_page_may_be_framed_nor_load_anything_from_elsewhere(client):
    """A page elsewhere that framed the confirmation could trick a click on its button."""
    for path in ("/cancel/order-1003", "/executions/order-1001", "/api/executions", "/nowhere"):
        headers = client.get(path).headers
        assert headers["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "default-src 'none'" in headers["content-security-policy"]


@pytest.mark.timeout(120)
def test_an_id_with_a_slash_spaces_and_accents_has_working_links(each_backend):
    weird = "orders/2026 #7?ü"
    with open_backend(each_backend) as backend:
        backend.executions.admit(weird, "order")
        client = TestClient(create_app(backend), base_url=ORIGIN)
        detail = client.get(re.search(r'href="(/executions/[^"]+)"', client.get("/").text)[1])
        assert detail.status_code == 200 and client.get(re.search(r'href="(/api/executions/[^"]+)"', detail.text)[1]
                                                        ).json()["execution"]["execution_id"] == weird
        confirm = client.get(re.search(r'href="(/cancel/[^"]+)"', detail.text)[1])
        action = re.search(r'<form method="post" action="([^"]+)"', confirm.text)[1]
        token = re.search(r'name="csrf_token" value="([^"]+)"', confirm.text)[1]
        done = client.post(action, data={"csrf_token": token}, headers={"Origin": ORIGIN}, follow_redirects=False)
        assert done.status_code == 303 and client.get(done.headers["location"]).status_code == 200
        assert backend.executions.get(weird).status == "cancelled"
