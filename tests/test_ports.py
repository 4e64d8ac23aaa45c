"""The servers' addresses: `pexec view` and `pexec guard serve` default to different ports, each binds its port
before printing that it serves, and a port in use is one line suggesting --port (exit 2), never a banner
followed by uvicorn's `[Errno 98]`."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import stop_group
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.web import listen

PEXEC = str(Path(sys.executable).with_name("pexec"))
BUSY = (
    "error: cannot listen on 127.0.0.1:{port}: Address already in use (another server holds it: choose another "
    "port with --port)"
)


def default_port(*command: str) -> int:
    """The default of the command's --port."""
    found = typer.main.get_command(app)
    for name in command:
        found = found.commands[name]  # type: ignore[attr-defined]
    return next(p.default for p in found.params if p.name == "port")


def test_the_viewer_and_the_guard_default_to_different_ports() -> None:
    assert (default_port("view"), default_port("guard", "serve")) == (8765, 8766)


@pytest.mark.parametrize("command", [["guard", "serve", "--env", "shop"], ["view", "RUN"]])
def test_a_port_in_use_is_one_line_naming_port_and_no_banner(command: list[str], tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        shown = CliRunner().invoke(app, [*command, "--port", str(port)])
    assert (shown.exit_code, shown.stderr.strip(), shown.stdout) == (2, BUSY.format(port=port), "")


def test_listen_names_an_address_that_cannot_be_bound() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(Exception, match=re.escape(BUSY.format(port=port).removeprefix("error: "))):
            listen("127.0.0.1", port)


@pytest.mark.server
def test_the_banner_names_the_port_bound_and_the_server_answers_on_it() -> None:
    proc = subprocess.Popen([PEXEC, "guard", "serve", "--env", "shop", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        port = int(re.fullmatch(r"guard: shop \(.+\) on http://127\.0\.0\.1:(\d+)\n", banner)[1])  # type: ignore[index]
        assert port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # bound before the banner
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port)
            conn.settimeout(30)
            assert conn.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        stop_group(proc)
