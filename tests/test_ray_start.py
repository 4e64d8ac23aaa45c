"""Starting a local Ray says nothing a user has to read: Ray's notice that token authentication is on (logged at
WARNING on every local start) is dropped, and only it. And what it starts listens on loopback only."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import ray_start

ROOT = Path(__file__).resolve().parents[1]
NOTICE = "Token authentication is enabled for this Ray cluster"


@pytest.mark.ray
def test_a_local_start_prints_no_token_notice() -> None:
    code = "import ray\nfrom pipeline.core.ray_start import start_ray\nstart_ray(None, 1)\nprint(ray.is_initialized())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a user's shell: no Ray settings
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert NOTICE not in done.stderr, done.stderr


def test_the_filter_drops_that_notice_only() -> None:
    keep = ray_start._TokenAuthNotice()
    record = logging.LogRecord("ray", logging.WARNING, __file__, 1, NOTICE + ". Set RAY_AUTH_MODE=disabled", (), None)
    assert not keep.filter(record)
    for other in ("Token authentication is disabled for this Ray cluster.", "Some other warning"):
        assert keep.filter(logging.LogRecord("ray", logging.WARNING, __file__, 1, other, (), None))


# What a local start leaves listening, and where: run in a fresh process (Ray reads where it may listen when it is
# first imported), before that process stops its Ray.
_LISTENING = """
import json
import psutil
from pipeline.core.ray_start import start_ray
start_ray(None, 1)
import ray
ray.get(ray.remote(lambda: 1).remote())
me = psutil.Process()
tree = [me, *me.children(recursive=True)]
found = []
for p in tree:
    try:
        found += [[p.name(), c.laddr.ip] for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass
print(json.dumps({"listening": found, "names": sorted({p.name() for p in tree})}))
"""


@pytest.mark.ray
def test_a_local_start_listens_on_loopback_only() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a user's shell: no Ray settings
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _LISTENING], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    names = {name for name, _ in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, seen  # the services were found listening
    exposed = [
        (n, ip) for n, ip in seen["listening"] if not ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback
    ]
    assert exposed == [], seen
