"""`@workflow(timeout=)` and `client.start(timeout=)` (SPEC section 12): a timeout in seconds,
checked where it is given (a bad one fails the app's import, or the start, naming `timeout`, with
nothing written); each workflow's default timeout, which a start that names none takes (as the
app's supervisor recorded it), and a start's own, which overrides it, on the sync and async
clients."""

from __future__ import annotations

import asyncio

import pytest

from supervisor import open_backend
from worker import AsyncClient, Client, InvalidArgument, Registry

pytestmark = pytest.mark.timeout(60)

BAD_TIMEOUTS = [0, -1, -0.5, float("nan"), float("inf"), float("-inf"), "30", True, False, [1], 10 ** 20]


def test_the_decorators_timeout_is_each_workflows_default_in_ms():
    registry = Registry()
    registry.workflow("slow", timeout=1.5)(lambda ctx, input: None)
    registry.workflow("brief", timeout=0.0001)(lambda ctx, input: None)
    registry.workflow("open")(lambda ctx, input: None)
    assert registry.defaults() == {"brief": ("default", 0, 1), "open": ("default", 0, None),
                                   "slow": ("default", 0, 1500)}


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_a_bad_timeout_in_the_decorator_is_refused_naming_it(bad):
    registry = Registry()
    with pytest.raises(InvalidArgument, match="timeout"):
        registry.workflow("w", timeout=bad)
    assert registry.names() == []


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_a_bad_timeout_in_a_start_is_refused_naming_it_and_admits_nothing(each_backend, db_snapshot, bad):
    with Client(each_backend) as client:
        client.start("send", id="kept")
        before = db_snapshot(each_backend)
        with pytest.raises(InvalidArgument, match="timeout"):
            client.start("send", id="new", timeout=bad)
        with pytest.raises(InvalidArgument, match="timeout"):
            client.start_json("send", "null", id="new", timeout=bad)
    assert db_snapshot(each_backend) == before


def test_a_start_takes_the_workflows_recorded_timeout_unless_it_names_its_own(each_backend):
    with open_backend(each_backend) as backend:
        backend.queues.record_defaults({"send": ("default", 0, 30_000)})
    with Client(each_backend) as client:
        default = client.start("send", id="s-1").record()
        own = client.start("send", id="s-2", timeout=2.5).record()
        none = client.start("other", id="o-1").record()
        assert client.start("send", id="s-1").execution_id == "s-1"  # idempotent: the same timeout
    assert default.deadline_at == default.created_at + 30_000
    assert own.deadline_at == own.created_at + 2500
    assert none.deadline_at is None


async def _start_async(ledger, **options):
    async with AsyncClient(ledger) as client:
        handle = await client.start("send", id="a-1", **options)
        return (await handle.record()).deadline_at, (await handle.record()).created_at


def test_the_async_client_starts_with_a_timeout_and_refuses_a_bad_one(each_backend):
    deadline, created = asyncio.run(_start_async(each_backend, timeout=4))
    assert deadline == created + 4000
    with pytest.raises(InvalidArgument, match="timeout"):
        asyncio.run(_start_async(each_backend, timeout=-4))
