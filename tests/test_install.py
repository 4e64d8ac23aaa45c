"""A wheel built from the project, installed into a fresh virtualenv, runs the demo outside the checkout:
specs, simulator pins and SQL ship as package data. The fresh environment reaches the already installed
dependencies through a .pth line (nothing is downloaded); pexec itself comes from the wheel only. The wheel
is the one `pexec submit --runtime package` ships."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pipeline.apps.jobs.cluster import build_wheel


def run(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.other_python
def test_the_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheel = build_wheel(tmp_path)  # from a clean copy of what the build reads: a stale build/ would hide a gap
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                    cwd=tmp_path, env=env).stdout.strip())  # fmt: skip
    # Only the dependencies' folder, as a plain path: its .pth files (the checkout's editable install) stay inert.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel), cwd=tmp_path, env=env)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = run(str(python), "-c", "import pipeline; print(pipeline.__file__)", cwd=work, env=env).stdout.strip()
    assert where.startswith(str(site)), where
    pexec = str(venv / "bin" / "pexec")
    run(pexec, "synth", "shop", "--rollouts", "300", "--tasks", "30", "--out", "store", cwd=work, env=env)
    scored = run(pexec, "score", "store", "--out", "run", "--inline", cwd=work, env=env)
    assert "scored 300" in scored.stderr
    metrics = run(pexec, "metrics", "run", "--by", "model", "--bootstrap", "50", "--json", cwd=work, env=env)
    assert sum(__import__("json").loads(line)["n"] for line in metrics.stdout.splitlines()) == 300
    listed = run(pexec, "envs", cwd=work, env=env).stdout
    assert "shop" in listed and "support" in listed and "tau_airline" in listed
    # An installed pexec cannot rebuild itself for `submit --runtime package`: refused on one line, at once.
    job = work / "job.toml"
    job.write_text(f'name = "j"\ninput = "{work / "store"}"\noutput = "{work / "out"}"\n')
    done = subprocess.run([pexec, "submit", str(job), "--runtime", "package", "--address", "http://127.0.0.1:9"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "runtime package builds pexec from its source checkout" in done.stderr
