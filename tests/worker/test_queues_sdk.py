"""`Queue` and `@workflow(queue=, priority=)` (SPEC section 12): limits checked when declared, one
name with one set of limits per app, each workflow's default queue and priority; `client.start`
takes them when it names none (as the app's supervisor recorded them), and names others when
asked."""

from __future__ import annotations

import pytest

from supervisor import open_backend
from worker import Client, InvalidArgument, Queue, Registry

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kwargs, match", [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": "5"}, "concurrency"), ({"per_key": 0}, "per_key"),
    ({"rate": (0, 1.0)}, "rate"), ({"rate": (5, 0)}, "rate"), ({"rate": (5, -1.0)}, "rate"), ({"rate": 5}, "rate"),
    ({"rate": (5, 1.0, 2)}, "rate"), ({"rate": (True, 1.0)}, "rate"),
])
def test_a_queue_with_a_bad_limit_is_refused_naming_it(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        Queue("q", **kwargs)


def test_a_queue_needs_a_name():
    with pytest.raises(InvalidArgument, match="queue name"):
        Queue("", concurrency=1)


def test_workflows_record_their_queue_and_priority_and_the_registry_its_queues():
    registry = Registry()
    email = Queue("email", concurrency=5, per_key=1, rate=(10, 1))

    @registry.workflow("send", queue=email, priority=2)
    def send(ctx, input):
        return None

    @registry.workflow("digest", queue=Queue("email", concurrency=5, per_key=1, rate=(10, 1.0)))
    def digest(ctx, input):
        return None

    @registry.workflow("plain")
    def plain(ctx, input):
        return None

    @registry.workflow("named", queue="bulk", priority=-1)
    def named(ctx, input):
        return None

    assert registry.queues() == [email]
    assert registry.defaults() == {"digest": ("email", 0, None), "named": ("bulk", -1, None),
                                   "plain": ("default", 0, None), "send": ("email", 2, None)}


def test_one_queue_name_declared_twice_with_different_limits_is_refused_at_import():
    registry = Registry()
    registry.workflow("a", queue=Queue("email", concurrency=5))(lambda ctx, input: None)
    with pytest.raises(InvalidArgument, match="email"):
        registry.workflow("b", queue=Queue("email", concurrency=6))


@pytest.mark.parametrize("kwargs, match", [({"priority": 1.5}, "priority"), ({"priority": 2 ** 40}, "priority"),
                                           ({"queue": 5}, "queue"), ({"queue": ""}, "queue")])
def test_a_bad_queue_or_priority_in_the_decorator_is_refused(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        Registry().workflow("w", **kwargs)


def test_client_start_takes_the_workflows_recorded_defaults_unless_it_names_others(each_backend):
    with open_backend(each_backend) as backend:
        backend.queues.record_defaults({"send": ("email", 2)})
    with Client(each_backend) as client:
        default = client.start("send", {"to": "a"}, id="s-1")
        named = client.start("send", {"to": "b"}, id="s-2", queue=Queue("bulk"), key="tenant-1", priority=9)
        other = client.start("other", id="o-1")
        assert client.start("send", {"to": "a"}, id="s-1").execution_id == default.execution_id  # idempotent
    with open_backend(each_backend) as backend:
        s1, s2, o1 = (backend.executions.get(i) for i in ("s-1", "s-2", "o-1"))
    assert (s1.queue, s1.key, s1.priority) == ("email", None, 2)
    assert (s2.queue, s2.key, s2.priority) == ("bulk", "tenant-1", 9)
    assert (o1.queue, o1.key, o1.priority) == ("default", None, 0)


async def _start_async(ledger):
    from worker import AsyncClient

    async with AsyncClient(ledger) as client:
        handle = await client.start("send", id="a-1", queue="email", key="k", priority=3)
        return handle.execution_id


def test_the_async_client_starts_in_a_queue(each_backend):
    import asyncio

    assert asyncio.run(_start_async(each_backend)) == "a-1"
    with open_backend(each_backend) as backend:
        record = backend.executions.get("a-1")
    assert (record.queue, record.key, record.priority) == ("email", "k", 3)
