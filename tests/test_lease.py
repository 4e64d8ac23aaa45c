"""One writer per run: the lease on a run prefix (pipeline.storage.lease), on a local disk and on the moto S3
server, and two real concurrent `pexec score` processes on the same run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from conftest import wait_for

from pipeline.core.errors import LeaseHeld, LeaseLost, ScoringFailed, StorageError
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.fs import exists, filesystem
from pipeline.storage.lease import LEASE, Lease, _dump, _me, _object_for, require_holder
from pipeline.storage.run import part_sizes, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

ROOT = Path(__file__).resolve().parents[1]
PEXEC = str(Path(sys.executable).with_name("pexec"))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.server)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict | None]:
    """A fresh run prefix: a local folder, or a prefix in the moto S3 server's bucket."""
    if request.param == "local":
        return str(tmp_path / "run"), None
    s3 = request.getfixturevalue("s3")
    return f"s3://pexec-test/{tmp_path.name}/run", s3


def test_a_second_writer_is_refused_naming_the_holder(where: tuple[str, dict | None]) -> None:
    run, storage = where
    with Lease(run, storage):
        with pytest.raises(LeaseHeld, match=rf"run {run} is being written by \S+@\S+ pid {os.getpid()} \(started "):
            Lease(run, storage).acquire()
        assert exists(f"{run}/{LEASE}", storage)
    assert not exists(f"{run}/{LEASE}", storage)  # released
    with Lease(run, storage):  # and free for the next writer
        pass


def test_a_stale_lease_is_taken_over_and_its_old_holder_stops(where: tuple[str, dict | None], caplog) -> None:
    run, storage = where
    old = Lease(run, storage, stale_after=0.5)
    old.acquire()
    time.sleep(0.7)  # no heartbeat: stale
    new = Lease(run, storage, stale_after=0.5)
    new.acquire()
    assert f"taking over the lease of {run} (stale): " in caplog.text
    with pytest.raises(LeaseLost, match="taken over by another writer"):
        old.renew()
    old.release()  # must not remove the new holder's lease
    assert exists(f"{run}/{LEASE}", storage)
    new.renew()
    new.release()
    assert not exists(f"{run}/{LEASE}", storage)


def test_the_heartbeat_keeps_a_long_run_alive(where: tuple[str, dict | None]) -> None:
    run, storage = where
    with Lease(run, storage, stale_after=0.5) as lease:
        time.sleep(1.5)  # three times the limit: only the heartbeat keeps it fresh
        with pytest.raises(LeaseHeld):
            Lease(run, storage, stale_after=0.5).acquire()
        lease.check()


def test_every_change_of_the_lease_object_is_conditional(where: tuple[str, dict | None]) -> None:
    """The compare-and-swap primitives themselves (S3: If-None-Match / If-Match on the server)."""
    run, storage = where
    obj = _object_for(f"{run}/{LEASE}", storage)
    me = _me()
    mine, renewed, theirs = (_dump(replace(me, token=t)) for t in ("mine", "mine-renewed", "theirs"))
    with obj.locked():
        v1 = obj.create(mine)
        assert v1 is not None and obj.create(theirs) is None  # exists already
        v2 = obj.swap(renewed, v1)
        assert v2 is not None and obj.swap(theirs, v1) is None  # v1 is no longer the version there
        obj.delete(v1)  # an outdated holder's release removes nothing
        assert exists(f"{run}/{LEASE}", storage)
        obj.delete(v2)
    assert not exists(f"{run}/{LEASE}", storage)


def test_simultaneous_acquisitions_on_a_local_disk_have_one_winner(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    won, refused = [], []
    start = threading.Barrier(8)

    def contend() -> None:
        lease = Lease(run)
        start.wait()
        try:
            lease.acquire()
            won.append(lease)
        except LeaseHeld:
            refused.append(lease)

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(won), len(refused)) == (1, 7)


def test_a_writer_frozen_inside_the_folder_lock_does_not_block_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder stopped (SIGSTOP) between taking the run folder's flock and releasing it once made the next
    writer wait forever; the next writer now waits LOCK_WAIT and refuses naming the holder."""
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "from pipeline.storage.lease import Lease\n"
            f"lease = Lease({str(run)!r}); lease.acquire()\n"
            f"fd = os.open({str(run)!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr("pipeline.storage.lease.LOCK_WAIT", 0.5)
        started = time.monotonic()
        with pytest.raises(LeaseHeld, match=rf"is being written by .* pid {holder.pid} .*held the run folder's lock"):
            Lease(str(run)).acquire()
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()


def test_the_lease_is_released_when_scoring_is_interrupted(tmp_path: Path) -> None:
    store, run = tmp_path / "store", tmp_path / "run"
    write_store(synthesize("shop", 50, 10, seed=1), str(store), per_file=10)

    def interrupt(report: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scoring(str(store), str(run), ScoreSettings(inline=True), on_shard=interrupt)
    assert not (run / LEASE).exists() and not (run / "_manifest.json").exists()


def test_only_the_current_acquisition_is_the_holder(where: tuple[str, dict | None]) -> None:
    run, storage = where
    with Lease(run, storage) as lease:
        token = lease.token
        require_holder(run, token, storage)
        with pytest.raises(LeaseLost, match=f"^the lease of {re.escape(run)} was taken over by another writer$"):
            require_holder(run, "another acquisition", storage)
    with pytest.raises(LeaseLost, match=f"^the lease of {re.escape(run)} was released: its writer stopped$"):
        require_holder(run, token, storage)


def test_tasks_of_a_writer_that_lost_the_lease_write_nothing(where: tuple[str, dict | None], shared_ray) -> None:
    """A stopping driver leaves its Ray tasks running (pipeline.scoring.driver.completed): each checks, right
    before writing, that its driver still holds the lease. Here another writer takes the lease after the plan
    and before any task ends, long before the driver's own heartbeat would notice: not one shard is written."""
    run, storage = where
    store = f"{run.rsplit('/', 1)[0]}/store"
    write_store(synthesize("shop", 200, 20, seed=3), store, per_file=50, storage_options=storage)
    lease_object = _object_for(f"{run}/{LEASE}", storage)

    def taken_over(plan: object) -> None:
        with lease_object.locked():
            _, version = lease_object.read()
            assert lease_object.swap(_dump(_me()), version) is not None

    taken = f"failed: the lease of {re.escape(run)} was taken over by another writer$"
    with pytest.raises(ScoringFailed, match=taken):
        run_scoring(store, run, ScoreSettings(shard_mb=20_000 / 2**20, storage_options=storage), on_plan=taken_over)
    assert read_shard_markers(run, storage) == {} and not any(part_sizes(run, storage).values())


# --- two real `pexec score` processes on one run ------------------------------------------------------


def lease_appears(run: str, storage: dict | None) -> None:
    """Wait for a writer's lease, polling often: the writer may be done soon after it appears."""
    deadline = time.monotonic() + 60
    while not exists(f"{run}/{LEASE}", storage):
        assert time.monotonic() < deadline, f"no lease under {run} after 60s"
        time.sleep(0.01)


def holder_pid(run: str) -> int | None:
    try:
        return orjson.loads((Path(run) / LEASE).read_bytes())["pid"]
    except FileNotFoundError:
        return None


def pexec_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def score_args(store: str, run: str, shard_mb: str, storage: dict | None) -> list[str]:
    args = [PEXEC, "score", store, "--out", run, "--inline", "--shard-mb", shard_mb]
    return args + (["--endpoint-url", storage["endpoint_url"]] if storage else [])


def run_rows(run: str, storage: dict | None) -> dict[str, list[dict]]:
    out = {}
    for name, key in (("steps", ("rollout_id", "step")), ("rollouts", ("rollout_id",)), ("rejects", ("source",))):
        fs, path = filesystem(f"{run}/{name}", storage)
        rows = pq.read_table(path, filesystem=fs).to_pylist()
        out[name] = sorted(rows, key=lambda r: tuple(r[k] for k in key))
    return out


@pytest.fixture(scope="module")
def store_and_clean(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict | None], tuple[str, str]]:
    """The store of 400 rollouts that the writer tests score, and its clean run (scored alone, by the console
    script, in 7 shards of 0.2 MiB): made at first use once per place, a local folder or the S3 bucket, and only
    read by the tests after that."""
    made: dict[str, tuple[str, str]] = {}

    def get(storage: dict | None) -> tuple[str, str]:
        place = "s3" if storage else "local"
        if place not in made:
            base = "s3://pexec-test/shared" if storage else str(tmp_path_factory.mktemp("shared"))
            store, clean = f"{base}/store", f"{base}/clean/run"  # a run named `run`: the same run_id as the tests'
            write_store(synthesize("shop", 400, 50, seed=5), store, per_file=100, storage_options=storage)
            subprocess.run(score_args(store, clean, "0.2", storage), env=pexec_env(), check=True, capture_output=True)
            made[place] = store, clean
        return made[place]

    return get


@pytest.mark.parametrize("second_shard_mb", ["0.2", "0.1"], ids=["same-shard-mb", "different-shard-mb"])
def test_two_concurrent_score_runs_one_refuses_and_the_run_equals_a_clean_one(
    where: tuple[str, dict | None], store_and_clean: Callable, second_shard_mb: str
) -> None:
    run, storage = where
    store, clean = store_and_clean(storage)
    first = subprocess.Popen(
        score_args(store, run, "0.2", storage), env=pexec_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        # Freeze the first writer while it holds the lease, so the second one certainly overlaps it.
        lease_appears(run, storage)
        os.kill(first.pid, signal.SIGSTOP)
        assert exists(f"{run}/{LEASE}", storage)
        second = subprocess.run(
            score_args(store, run, second_shard_mb, storage), env=pexec_env(), capture_output=True, text=True
        )
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert second.returncode == 2
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: run {run} is being written by "), second.stderr
    assert f"pid {first.pid} " in lines[0]
    assert not exists(f"{run}/{LEASE}", storage)
    assert run_rows(run, storage) == run_rows(clean, storage)


def test_a_killed_writer_on_this_host_does_not_block_the_rerun(tmp_path: Path, store_and_clean: Callable) -> None:
    (store, clean), run = store_and_clean(None), str(tmp_path / "run")
    killed = subprocess.Popen(score_args(store, run, "0.2", None), env=pexec_env(), stderr=subprocess.DEVNULL)
    lease_appears(run, None)
    killed.kill()  # SIGKILL: no clean-up, the lease stays behind
    killed.wait()
    assert exists(f"{run}/{LEASE}")
    rerun = subprocess.run(score_args(store, run, "0.2", None), env=pexec_env(), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"taking over the lease of {run} (its process is gone): " in rerun.stderr
    assert run_rows(run, None) == run_rows(clean, None)


def test_a_missing_bucket_is_one_clear_error(s3: dict) -> None:
    with pytest.raises(StorageError, match=r"cannot take the lease s3://no-such-bucket/run/_lease\.json: "):
        Lease("s3://no-such-bucket/run", s3).acquire()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signalled_score_releases_its_lease_and_commits_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    store, run = str(tmp_path / "store"), str(tmp_path / "run")
    write_store(synthesize("shop", 6000, 100, seed=5), store, per_file=500)  # a few seconds of scoring
    proc = subprocess.Popen(score_args(store, run, "0.05", None), env=pexec_env(), stderr=subprocess.PIPE)
    lease_appears(run, None)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    assert not exists(f"{run}/{LEASE}") and not exists(f"{run}/_manifest.json")


def test_a_writer_whose_stale_lease_was_taken_over_stops_without_committing(tmp_path: Path) -> None:
    store, run, clean = str(tmp_path / "store"), str(tmp_path / "run"), str(tmp_path / "clean" / "run")
    write_store(synthesize("shop", 2000, 100, seed=5), store, per_file=250)
    subprocess.run(score_args(store, clean, "0.2", None), env=pexec_env(), check=True, capture_output=True)
    args = [*score_args(store, run, "0.2", None), "--lease-stale-after", "1"]
    first = subprocess.Popen(args, env=pexec_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lease_appears(run, None)
    os.kill(first.pid, signal.SIGSTOP)  # hung: no heartbeat
    time.sleep(1.5)
    second = subprocess.Popen(args, env=pexec_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: holder_pid(run) == second.pid, 60, "the second writer's takeover")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, first_err = first.communicate(timeout=120)
    _, second_err = second.communicate(timeout=120)
    assert second.returncode == 0, second_err
    assert f"taking over the lease of {run} (stale): " in second_err
    assert first.returncode == 2, first_err
    assert first_err.strip().splitlines()[-1] == f"error: the lease of {run} was taken over by another writer"
    assert run_rows(run, None) == run_rows(clean, None)


def test_a_signal_handed_to_another_thread_while_the_lease_is_taken_waits_for_its_release(tmp_path: Path) -> None:
    # The kernel hands a process's signal to any thread that does not block it (a progress bar's thread, made
    # before the lease): its handler then runs in the main thread, which must not be between the lease file's
    # creation and the `with` that releases it.
    run = str(tmp_path / "run")
    go = threading.Event()
    other = threading.Thread(target=lambda: go.wait() and signal.pthread_kill(other.ident, signal.SIGINT))
    other.start()
    lease = Lease(run)
    with pytest.raises(KeyboardInterrupt), ExitStack() as held:
        with lease.taking():
            lease.acquire()
            go.set()
            other.join()
            time.sleep(0.05)  # the main thread would run the handler here
            held.enter_context(lease)
        pytest.fail("the signal was lost")  # it arrives as the block ends
    assert not exists(f"{run}/{LEASE}")
