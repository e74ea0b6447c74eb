"""`yieldstar ui` as a command: its `--addr`, loopback by default, the real server over uvicorn,
and a clear error without the `ui` extra."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from faults import cli
from ui_story import start_ui, stop

from supervisor import open_backend
from supervisor.cli import main
from supervisor.cli.ui import DEFAULT_ADDR, parse_addr


def fetch(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text, address", [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("9000", ("127.0.0.1", 9000)),
                                           ("[::1]:8081", ("::1", 8081)), ("0.0.0.0:80", ("0.0.0.0", 80)),
                                           ("localhost:0", ("localhost", 0))])
def test_addr_is_host_and_port_or_a_port_alone_on_loopback(text, address):
    assert parse_addr(text) == address


@pytest.mark.timeout(30)
def test_the_default_address_is_loopback():
    (addr,) = [p for p in main.commands["ui"].params if p.name == "addr"]
    assert addr.default == DEFAULT_ADDR == "127.0.0.1:8080"
    assert parse_addr(addr.default)[0] == "127.0.0.1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("addr", ["nonsense", "127.0.0.1:http", "127.0.0.1:70000", ":8080", "1:2:3"])
def test_a_bad_addr_is_refused_by_name(sqlite_path, addr):
    open_backend(sqlite_path).close()  # refused for its --addr, not for a missing ledger
    with pytest.raises(ValueError, match="--addr"):
        parse_addr(addr)
    done = cli(sqlite_path, "ui", "--addr", addr)
    assert done.returncode == 2 and done.stderr.startswith("yieldstar: --addr ") and "Traceback" not in done.stderr


@pytest.mark.timeout(60)
def test_a_missing_ledger_is_refused_and_not_created(tmp_path):
    done = cli(tmp_path / "none.db", "ui", "--addr", "127.0.0.1:0")
    assert done.returncode == 2 and "no ledger at" in done.stderr
    assert not (tmp_path / "none.db").exists()


@pytest.mark.timeout(120)
def test_the_server_serves_on_loopback_and_stops_on_ctrl_c(story):
    process, url = start_ui(story, "--addr", "0")  # a port alone: loopback, any free port
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
        status, page = fetch(url)
        assert status == 200 and 'href="/executions/order-1001"' in page
        status, detail = fetch(url + "api/executions/order-1001")
        assert status == 200 and '"ended_by": "superseded"' in detail
        assert fetch(url, host="evil.example")[0] == 403
        taken = cli(story, "ui", "--addr", url[len("http://"):-1])
        assert taken.returncode == 2 and "--addr 127.0.0.1:" in taken.stderr and "in use" in taken.stderr
    finally:
        code = stop(process)
    assert code == 0, process.stderr.read()


@pytest.mark.timeout(60)
def test_without_the_ui_extra_the_command_names_the_install(sqlite_path):
    open_backend(sqlite_path).close()
    blocked = ("import sys; sys.modules['starlette'] = None; from supervisor.cli import entry; "
               f"sys.argv = ['yieldstar', '--db', {str(sqlite_path)!r}, 'ui']; entry()")
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("yieldstar: yieldstar ui needs the ui extra (starlette is not installed):"
                           " pip install 'yieldstar[ui]'\n")


@pytest.mark.timeout(60)
def test_no_other_command_imports_the_ui_libraries(sqlite_path):
    open_backend(sqlite_path).close()
    check = ("import sys; from supervisor.cli import main; import worker; "
             "main(['--db', sys.argv[1], 'stats'], standalone_mode=False); "
             "print(sorted(m for m in ('starlette', 'jinja2', 'uvicorn', 'supervisor.ui') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", check, str(sqlite_path)], capture_output=True, text=True, timeout=30,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
