"""The peak memory a shard's marker reports is the scoring process's own (VmHWM), and a Ray task's its own: not the
high-water mark Linux carries across fork and exec (`ru_maxrss`), nor the largest of the tasks a worker ran before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.scoring.memory import peak_mib, restart_peak
from pipeline.storage.run import read_manifest
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

BIG_MIB = 600  # what a parent (or an earlier task) held: far above what scoring this store needs

# Holds BIG_MIB, touched page by page, then lets it go: the process's peak is at least that from here on.
_HOLD = f"held = bytearray({BIG_MIB} * 2**20)\nfor i in range(0, len(held), 4096): held[i] = 1\ndel held\n"


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    write_store(synthesize("shop", 400, 40, seed=3), str(store), per_file=100)
    return store


def _peaks(run: Path) -> list[float]:
    manifest = read_manifest(str(run))
    assert manifest is not None and manifest.counts.scored == 400
    return [s.peak_rss_mib for s in manifest.shards]


def test_a_run_started_by_a_large_process_reports_its_own_peak_not_its_parents(tmp_path):
    store, run = _store(tmp_path), tmp_path / "run"
    score = [sys.executable, "-m", "pipeline.apps.cli", "score", str(store), "--inline", "--out", str(run)]
    code = _HOLD + f"import subprocess\nsubprocess.run({score!r}, check=True, capture_output=True)\n"
    subprocess.run([sys.executable, "-c", code], check=True)
    peaks = _peaks(run)
    assert len(peaks) == 4
    assert all(0 < p < BIG_MIB / 2 for p in peaks), peaks  # ru_maxrss would start at the parent's 600 MiB


def test_a_task_reports_its_own_peak_not_the_largest_its_worker_reached_before(tmp_path):
    store, run = _store(tmp_path), tmp_path / "run"
    code = _HOLD + textwrap.dedent(f"""
        import json
        from pipeline.scoring import driver, shard
        from pipeline.scoring.memory import peak_mib
        from pipeline.scoring.settings import ScoreSettings
        before = peak_mib()
        driver.score_shard = shard.score_task  # each shard as a Ray worker runs it, in this one process
        driver.run_scoring({str(store)!r}, {str(run)!r}, ScoreSettings(inline=True))
        print(json.dumps(before))
    """)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(done.stdout) >= BIG_MIB  # the earlier work's peak, in this process
    peaks = _peaks(run)
    assert all(0 < p < BIG_MIB / 2 for p in peaks), peaks


def test_restarting_the_peak_starts_it_from_the_resident_memory():
    held = bytearray(200 * 2**20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    high = peak_mib()
    del held
    assert restart_peak()
    assert peak_mib() < high - 150


def test_the_peak_of_a_process_that_exited_unreaped_is_a_lookup_error_not_a_crash():
    """A sampler that lists a Ray worker as it exits finds a zombie: its status has no memory lines left."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while "State:\tZ" not in Path(f"/proc/{child.pid}/status").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ProcessLookupError, match="has exited"):
            peak_mib(child.pid)
    finally:
        child.wait()
    assert peak_mib() > 0
