"""The guard's budgets bound the memory it really holds: `pexec guard serve` in a subprocess, its resident memory
read from /proc/PID/status (VmRSS) before and after, against what `/health` says it holds.

Measured before: a 7.9 MiB `env` was not counted (+72 MiB per live session: ~70 GB at 1,000 sessions); the
stateless cache ignored `env` (+401 MiB while `/health` said `cached_bytes: 0`); one check on a session at its
16 MiB budget grew it to 154 MiB (the word index); an empty session took ~0.9 MiB (1,000: +913 MiB) uncounted.

Tolerances: RSS moves by what the allocator keeps or returns besides what the guard holds; each bound below
allows 24 MiB of that (the RSS of a fresh guard varies by about 10 MiB between runs).
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from conftest import starts, stop_group
from test_guard_http import AVA, SIGN_IN, TOKEN, Client, resident_bytes, start_server

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it too
MIB = 1024 * 1024
SLACK = 24 * MIB


def big_env(records: int = 300_000) -> dict:
    """An `env` of many small objects, 7.8 MiB of JSON: the costliest in memory per byte (86 MiB of objects)."""
    return {"state": {"notes": [{"id": f"x{i}", "v": i} for i in range(records)]}}


class Served:
    def __init__(self, *args: str) -> None:
        self.proc, port = start_server("--env", "shop", "--token", TOKEN, *args)
        self.client = Client(port, timeout=120)  # a 7.8 MiB env took over 30 s on a loaded machine

    def rss(self) -> int:
        return resident_bytes(self.proc.pid)

    def health(self) -> dict:
        status, health = self.client("GET", "/health")
        assert status == 200
        return health


@pytest.fixture
@starts("server")
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    guard = Served(*request.param)
    try:
        yield guard
    finally:
        stop_group(guard.proc)


@pytest.mark.parametrize("served", [("--session-mb", "16")], indirect=True)
def test_an_env_over_the_session_budget_is_refused(served: Served) -> None:
    body = orjson.dumps({"env": big_env()})
    assert 7.5 * MIB < len(body) < 8 * MIB
    before = served.rss()
    for _ in range(3):
        status, answer = served.client("POST", "/sessions", raw=body)
        assert status == 413 and "env takes over 16777216 bytes in memory" in answer["error"]
    health = served.health()
    assert health["sessions"] == 0 and health["held_bytes"] == 0
    grown = served.rss() - before
    assert grown < SLACK + 8 * MIB, f"RSS grew {grown / MIB:.0f} MiB for three refused sessions"  # the body's copy


@pytest.mark.parametrize("served", [("--session-mb", "256", "--memory-mb", "700", "--cache-mb", "1")], indirect=True)
def test_an_env_is_counted_and_the_guards_total_holds(served: Served) -> None:
    # Each session with the 7.8 MiB env holds ~170 MiB of memory (the env's objects and the spec state's copy):
    # counted, so that three fit the 700 MiB and the fourth is refused; the count is never under the RSS growth.
    body = orjson.dumps({"env": big_env()})
    before = served.rss()
    statuses = [served.client("POST", "/sessions", raw=body)[0] for _ in range(4)]
    health = served.health()
    grown = served.rss() - before
    assert statuses == [201, 201, 201, 429], statuses
    assert health["sessions"] == 3 and health["held_bytes"] <= 699 * MIB
    assert grown <= health["held_bytes"] + SLACK, (grown / MIB, health["held_bytes"] / MIB)
    print(f"3 sessions of a 7.8 MiB env: RSS +{grown / MIB:.0f} MiB, counted {health['held_bytes'] / MIB:.0f} MiB")


@pytest.mark.parametrize("served", [("--cache-mb", "64", "--session-mb", "256")], indirect=True)
def test_the_stateless_cache_counts_env(served: Served) -> None:
    # Measured before: stateless checks with a large env grew the RSS by 401 MiB while `cached_bytes` was 0.
    env = big_env(40_000)  # 1 MiB of JSON, ~26 MiB counted: two fit the 64 MiB cache
    before = served.rss()
    for i in range(10):
        body = {"start": {"env": env, "rollout_id": f"s{i}"}, "events": [], "call": SIGN_IN}
        assert served.client("POST", "/check", body)[0] == 200
    health = served.health()
    grown = served.rss() - before
    assert 0 < health["cached"] <= 2 and 0 < health["cached_bytes"] <= 64 * MIB, health
    each = health["cached_bytes"] // health["cached"]
    # The cache, and the one request in flight (whose peak the allocator keeps for the next): never ten envs.
    assert grown <= 64 * MIB + each + SLACK, f"RSS grew {grown / MIB:.0f} MiB for a 64 MiB cache"
    print(
        f"10 stateless checks, each a 1 MiB env, under a 64 MiB cache: RSS +{grown / MIB:.0f} MiB, "
        f"cached {health['cached']} of {each / MIB:.0f} MiB each"
    )


@pytest.mark.parametrize("served", [()], indirect=True)
def test_an_empty_session_is_measured_and_counted(served: Served) -> None:
    # Measured before: ~0.9 MiB per empty session (every session compiled the spec again), not counted.
    base = served.health()["session_base_bytes"]
    before = served.rss()
    for _ in range(300):
        assert served.client("POST", "/sessions", {})[0] == 201
    health = served.health()
    grown = served.rss() - before
    assert 300 * base <= health["held_bytes"] <= 300 * (base + 1024)  # and each empty `env` ({}: 160 bytes)
    assert grown <= health["held_bytes"] + SLACK, (grown / MIB, health["held_bytes"] / MIB)
    assert base < 256 * 1024  # the compiled spec is shared: only the state is a session's own
    print(f"300 empty shop sessions: RSS +{grown / MIB:.1f} MiB, counted {health['held_bytes'] / MIB:.1f} MiB")


@pytest.mark.parametrize("served", [("--session-mb", "4")], indirect=True)
def test_a_check_at_the_budget_does_not_grow_past_it(served: Served) -> None:
    # Measured before: one check on a session at its 16 MiB budget grew the guard by 154 MiB (the word index
    # split every text that held the value asked about).
    sid = served.client("POST", "/sessions", {})[1]["session"]
    words = " ".join(f"w{i}" for i in range(8_000))  # 56 KB: short enough to be split into its words
    statuses = []
    while not statuses or statuses[-1] == 200:
        content = f"{AVA} {len(statuses)} {words}"  # each message holds the grounded values the checks ask about
        statuses.append(served.client("POST", f"/sessions/{sid}/message", {"role": "user", "content": content})[0])
    assert statuses[-1] == 413 and len(statuses) > 20
    before, held = served.rss(), served.health()["held_bytes"]
    for _ in range(5):
        status, verdict = served.client("POST", f"/sessions/{sid}/check", {"call": SIGN_IN})
        assert status == 200 and verdict["valid"], verdict
    health = served.health()
    grown = served.rss() - before
    assert health["held_bytes"] <= 4 * MIB + health["session_base_bytes"]
    assert grown < SLACK, f"RSS grew {grown / MIB:.0f} MiB on checks of a session at its budget"
    print(
        f"5 checks at a 4 MiB budget: RSS +{grown / MIB:.1f} MiB, held {held / MIB:.2f} -> "
        f"{health['held_bytes'] / MIB:.2f} MiB"
    )
