"""The application client's payload limit (`Client(max_payload_bytes=)`, 4 MiB by default): an
input, an effect's result or a store item above it raises `PayloadTooLarge` naming it, and
nothing is written."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.ledger.arguments import DEFAULT_MAX_PAYLOAD_BYTES
from worker import AsyncClient, Client, InvalidArgument, PayloadTooLarge

LIMIT = 64
BIG = "x" * LIMIT  # 66 bytes of JSON


def message(name: str, size: int, limit: int = LIMIT) -> str:
    return f"{name} is {size:,} bytes of JSON, above the payload limit of {limit:,} bytes (max_payload_bytes)"


@pytest.mark.timeout(60)
def test_client_refuses_a_payload_above_its_limit_naming_it_and_writes_nothing(each_backend, db_snapshot):
    with Client(each_backend, max_payload_bytes=LIMIT) as client:
        client.start("charge", "small", id="small")
        before = db_snapshot(each_backend)
        cases = [
            (lambda: client.start("charge", BIG, id="big"), message("input", 66)),
            (lambda: client.start_json("charge", f'"{BIG}"', id="big"), message("input", 66)),
            (lambda: client.settle("fx-1", BIG, create=True), message("result", 66)),
            (lambda: client.put("box", BIG), message("store 'box' item", 66)),
        ]
        for call, expected in cases:
            with pytest.raises(PayloadTooLarge) as raised:
                call()
            assert str(raised.value) == expected
        assert db_snapshot(each_backend) == before


@pytest.mark.timeout(60)
def test_async_client_refuses_an_input_above_its_limit(each_backend, db_snapshot):
    async def start_big():
        async with AsyncClient(each_backend, max_payload_bytes=LIMIT) as client:
            await client.start("charge", BIG, id="big")

    with Client(each_backend) as client:
        client.start("charge", "small", id="small")
    before = db_snapshot(each_backend)
    with pytest.raises(PayloadTooLarge, match="^input is 66 bytes"):
        asyncio.run(start_big())
    assert db_snapshot(each_backend) == before


@pytest.mark.timeout(60)
def test_client_default_limit_is_4_mib(sqlite_path):
    with Client(sqlite_path) as client:
        assert client.backend.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES
        with pytest.raises(PayloadTooLarge) as raised:
            client.start("charge", "x" * DEFAULT_MAX_PAYLOAD_BYTES)
        assert str(raised.value) == message("input", DEFAULT_MAX_PAYLOAD_BYTES + 2, DEFAULT_MAX_PAYLOAD_BYTES)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [0, -5, "4MB", 1.5, True])
def test_a_bad_max_payload_bytes_is_refused_naming_it(sqlite_path, bad):
    with pytest.raises(InvalidArgument, match="max_payload_bytes"):
        Client(sqlite_path, max_payload_bytes=bad)
