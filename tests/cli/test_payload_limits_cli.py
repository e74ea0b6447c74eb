"""Payload limits on the command line, each with a real `yieldstar` process: a payload above the
limit is one line on stderr naming the user's option and `--max-payload`, exit 2, no traceback,
nothing written; `get`, `steps` and `store ls` print a long payload cut short unless `--full`;
`--json` keeps it whole."""

from __future__ import annotations

import json

import psutil
import pytest

from faults import cli
from supervisor import Failed, open_backend
from supervisor.ledger.arguments import DEFAULT_MAX_PAYLOAD_BYTES

pytestmark = pytest.mark.usefixtures("dump_on_hang")


def json_string(size: int) -> str:
    """A JSON string of exactly `size` bytes."""
    return '"' + "x" * (size - 2) + '"'


@pytest.mark.timeout(60)
def test_start_with_an_input_file_above_the_limit_names_the_option_and_writes_nothing(
        sqlite_path, tmp_path, db_snapshot):
    cli(sqlite_path, "start", "W", "--id", "first")
    before = db_snapshot(sqlite_path)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * (5 * 1024 * 1024)}))

    done = cli(sqlite_path, "start", "W", "--input", f"@{big}")

    assert done.returncode == 2
    assert done.stderr == (f"yieldstar: --input (from {big}) is 5,242,892 bytes of JSON, above the payload limit of"
                           " 4,194,304 bytes (--max-payload)\n")
    assert done.stdout == ""
    assert db_snapshot(sqlite_path) == before


@pytest.mark.timeout(60)
def test_start_max_payload_raises_or_lowers_the_limit(sqlite_path, tmp_path):
    above_default = tmp_path / "above.json"
    above_default.write_text(json_string(DEFAULT_MAX_PAYLOAD_BYTES + 1))

    done = cli(sqlite_path, "start", "W", "--id", "big", "--input", f"@{above_default}", "--max-payload", "5MB")
    assert (done.returncode, done.stdout) == (0, "big\n"), done.stderr

    done = cli(sqlite_path, "start", "W", "--id", "small", "--input", json_string(101), "--max-payload", "100")
    assert done.returncode == 2
    assert done.stderr == ("yieldstar: --input is 101 bytes of JSON, above the payload limit of 100 bytes"
                           " (--max-payload)\n")
    with open_backend(sqlite_path) as backend:
        assert backend.executions.get("small") is None
        assert len(backend.executions.get("big").input_json) == DEFAULT_MAX_PAYLOAD_BYTES + 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size, message", [
    ("0", "'0' is less than one byte"),
    ("0.4", "'0.4' is less than one byte"),
    ("lots", "'lots' is not a size: write a number of bytes, or a number and a unit, like 8MB or 512KiB"),
    ("8 MX", "'8 MX' is not a size"),
    ("", "'' is not a size"),
])
def test_a_bad_max_payload_is_refused_naming_the_option(sqlite_path, size, message):
    done = cli(sqlite_path, "start", "W", "--max-payload", size)

    assert done.returncode == 2
    assert done.stderr.startswith(f"yieldstar: --max-payload: {message}")
    assert "Traceback" not in done.stderr
    assert not sqlite_path.exists()


@pytest.mark.timeout(60)
def test_store_put_set_and_settle_above_the_limit_name_what_and_write_nothing(sqlite_path, db_snapshot):
    cli(sqlite_path, "store", "set", "box", f"[{json_string(40)}]")
    before = db_snapshot(sqlite_path)

    cases = [
        (("store", "put", "box", json_string(65)), "ITEM is 65 bytes"),
        (("store", "put", "box", json_string(40)), "store 'box' value is 83 bytes"),  # the list grown too long
        (("store", "set", "box", json_string(65)), "STATE is 65 bytes"),
        (("settle", "fx-1", "--create", "--result", json_string(65)), "--result is 65 bytes"),
    ]
    for args, start in cases:
        done = cli(sqlite_path, *args, "--max-payload", "64")
        assert done.returncode == 2, args
        assert done.stderr == f"yieldstar: {start} of JSON, above the payload limit of 64 bytes (--max-payload)\n"
    assert db_snapshot(sqlite_path) == before


@pytest.mark.timeout(60)
def test_get_steps_and_store_ls_cut_a_long_payload_short_unless_full(sqlite_path):
    long_input = {"items": ["é" * 10] * 300}
    text = json.dumps(long_input, ensure_ascii=False)  # 4,211 characters, 7,211 bytes
    with open_backend(sqlite_path) as backend:
        backend.executions.admit("long", "W", text)
        [lease] = backend.executions.claim_due(limit=1, duration=30_000)
        backend.heap.write_step(lease, step_key="fetch", step_attempt=1, done=True,
                                step_response_json=json.dumps({"value": "y" * 3000}))
        backend.stores.set("box", json.dumps(["z" * 2500]))

    shown = cli(sqlite_path, "get", "long").stdout
    [line] = [line for line in shown.splitlines() if line.startswith("input ")]
    assert line.split(None, 1)[1] == text[:2000] + "… (7,211 bytes; --full shows all)"
    assert f"{'input':<27} {text}\n" in cli(sqlite_path, "get", "long", "--full").stdout
    assert json.loads(cli(sqlite_path, "get", "long", "--json").stdout)["input"] == long_input

    step = cli(sqlite_path, "steps", "long").stdout
    assert step.startswith("fetch\tattempt=1\tdone=true\t" + '{"value": "' + "y" * 1989 + "… (3,013 bytes;")
    assert "y" * 3000 in cli(sqlite_path, "steps", "long", "--full").stdout
    assert json.loads(cli(sqlite_path, "steps", "long", "--json").stdout)[0]["step_response"] == {"value": "y" * 3000}

    assert cli(sqlite_path, "store", "ls").stdout.endswith("… (2,504 bytes; --full shows all)\n")
    assert "z" * 2500 in cli(sqlite_path, "store", "ls", "--full").stdout


@pytest.mark.timeout(60)
def test_get_shows_an_errors_traceback_whole_up_to_64_kib(sqlite_path):
    """A deep traceback is longer than 2,000 characters, and where it was raised is at its end:
    `get` shows an error as its lines up to 64 KiB, and only a longer one cut short."""
    deep = "".join(f'  File "app.py", line {n}, in f{n}\n    f{n + 1}()\n' for n in range(60)) + "ValueError: boom\n"
    with open_backend(sqlite_path) as backend:
        for execution_id, traceback in (("deep", deep), ("huge", deep * 30)):
            backend.executions.admit(execution_id, "W")
            [lease] = backend.executions.claim_due(limit=1, duration=30_000)
            error = {"type": "ValueError", "message": "boom", "traceback": traceback}
            backend.executions.acknowledge(lease, Failed(json.dumps(error)))
    assert len(deep) > 2000 and len(deep) * 30 > 64 * 1024

    shown = cli(sqlite_path, "get", "deep").stdout
    assert f"{'error':<27} ValueError: boom\n" in shown
    assert f"{'':<27} ValueError: boom\n" in shown  # the traceback's last line
    huge = cli(sqlite_path, "get", "huge").stdout
    assert "bytes; --full shows all)\n" in huge and len(huge) < 5000
    assert f"{'':<27} ValueError: boom\n" in cli(sqlite_path, "get", "huge", "--full").stdout


@pytest.mark.timeout(120)
def test_get_of_an_input_at_the_limit_stays_small_in_memory(sqlite_path, tmp_path):
    """`get` of a 4 MiB input neither decodes it nor prints it: its peak memory stays within a
    few times the payload over what `get` of a tiny one takes (it was 45 MB over, decoding it)."""
    items, size = [], 2
    while size < DEFAULT_MAX_PAYLOAD_BYTES - 100:  # many small objects: what decoding makes large
        item = {"id": len(items), "name": f"item-{len(items)}", "ok": True}
        size += len(json.dumps(item, separators=(",", ":"))) + 1
        items.append(item)
    with open_backend(sqlite_path) as backend:
        backend.executions.admit("big", "W", json.dumps(items, separators=(",", ":")))
        backend.executions.admit("tiny", "W", "1")

    def peak_rss(*args: str) -> int:
        import subprocess
        import sys

        process = psutil.Popen([sys.executable, "-c", PEAK, str(sqlite_path), *args], stdout=subprocess.PIPE)
        out, _ = process.communicate(timeout=60)
        return int(out.decode().split()[-1])

    tiny, big = peak_rss("get", "tiny"), peak_rss("get", "big")
    assert big - tiny < 24 * 1024 * 1024, (tiny, big)


# Runs `yieldstar --db DB ARGS...` in this process, then prints its peak RSS in bytes (ru_maxrss
# is in KiB on Linux), after what the command printed.
PEAK = """
import resource, sys
from supervisor.cli import main
try:
    main(["--db", sys.argv[1], *sys.argv[2:]])
except SystemExit:
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text, size", [
    ("4194304", 4_194_304), ("8MB", 8_000_000), ("8mb", 8_000_000), ("512KiB", 524_288), ("1.5 MiB", 1_572_864),
    ("4MiB", 4_194_304), ("1GB", 10 ** 9), ("100B", 100), (" 2 kb ", 2000),
])
def test_max_payload_sizes_are_bytes_or_a_number_and_a_unit(text, size):
    from supervisor.humane import parse_size

    assert parse_size(text) == size
