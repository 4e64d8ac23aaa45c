"""The guard's latency per check (`pexec bench guard`, `python -m pipeline.apps.perf.guard`): p50 and p99 of one
check of the next call at session depth 1, 10 and 50, in the `shop` spec and in BFCL (v4 simulators):

- library: `GuardSession.check` in this process;
- HTTP: `POST /sessions/{id}/check` on `pexec guard serve` over loopback, 50 sessions at once (one client
  connection each, aiohttp), the client's time per request;
- baseline: deciding the same call by replaying the session's whole prefix with the batch checker (what a
  guard without incremental state does), in the same run (the library's baseline; HTTP has none).

Each session records every checked call (the agent's loop: check, run the tool, record), so a check at
depth d follows d - 1 recorded calls. An HTTP agent pauses before each check (uniform, mean `think_s`: its
model deciding the call), and a second pass sends back to back (the service saturated). Not a timed test:
figures go in docs/reference/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

import numpy as np
import orjson

from pipeline.apps.guard import open_session
from pipeline.apps.perf.figures import Bench, Figure, figure, load_average, n_runs, show
from pipeline.core.model import Call, Message, Rollout
from pipeline.envs import get_environment
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.replay.checker import replay

DEPTHS = (1, 10, 50)


@dataclass(frozen=True)
class Scenario:
    """An environment, a start and an endless sequence of valid calls (after the opening messages)."""

    name: str
    env: str
    start: dict[str, Any]
    messages: tuple[str, ...]
    calls: Callable[[], Iterator[Call]] = field(repr=False)


def _shop_calls() -> Iterator[Call]:
    state = cast(SpecEnvironment, get_environment("shop")).spec.initial_state  # `shop` is a spec
    order = state["users"]["U1001"]["orders"][0]
    product = next(iter(state["products"]))
    yield Call("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"})
    yield Call("list_products", {})
    yield from itertools.cycle(
        [
            Call("get_user", {"user_id": "U1001"}),
            Call("get_order", {"order_id": order}),
            Call("get_product", {"product_id": product}),
            Call("list_products", {}),
        ]
    )


def _bfcl_calls() -> Iterator[Call]:
    for i in itertools.count():
        yield Call("mkdir", {"dir_name": f"d{i}"}) if i % 2 == 0 else Call("ls", {"a": False})


SCENARIOS = (
    Scenario("shop", "shop", {}, ("Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701).",), _shop_calls),
    Scenario(
        "bfcl",
        "bfcl_v4",
        {
            "involved_classes": ["GorillaFileSystem", "MathAPI"],
            "initial_config": {"GorillaFileSystem": {"root": {"alex": {"type": "directory", "contents": {}}}}},
        },
        ("Make folders in my home directory and list them.",),
        _bfcl_calls,
    ),
)


Times = dict[int, list[float]]  # depth -> seconds of each check at that depth

# What `details` keeps per scenario: the checks' times per run of each path.
ScenarioTimes = TypedDict(
    "ScenarioTimes", {"library": list[Times], "re-replay": list[Times], "http": Times, "saturated": Times}
)


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 in microseconds, and the number of samples."""
    us = np.asarray(samples) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)), "n": len(samples)}


def library(scenario: Scenario, sessions: int) -> dict[int, list[float]]:
    """Per depth, the seconds of each check, over `sessions` sessions taken to depth max(DEPTHS)."""
    times: dict[int, list[float]] = {d: [] for d in DEPTHS}
    clock = time.perf_counter
    for i in range(sessions):
        session = open_session(scenario.env, scenario.start, rollout_id=f"bench-{i}")
        for text in scenario.messages:
            session.message("user", text)
        for depth, call in zip(range(1, max(DEPTHS) + 1), scenario.calls(), strict=False):
            began = clock()
            verdict = session.check(call)
            elapsed = clock() - began
            if not verdict.valid:
                raise RuntimeError(f"bench {scenario.name}: step {depth} {call.tool} is invalid: {verdict.detail}")
            if depth in times:
                times[depth].append(elapsed)
            session.record(call, output=verdict.output)
        session.close()
    return times


def rereplay(scenario: Scenario, repeats: int) -> dict[int, list[float]]:
    """Per depth, the seconds to decide the call at that depth by replaying the prefix and the call."""
    env = get_environment(scenario.env)
    events: list[Message | Call] = [Message("user", text) for text in scenario.messages]
    calls = list(itertools.islice(scenario.calls(), max(DEPTHS)))
    times: dict[int, list[float]] = {d: [] for d in DEPTHS}
    for depth in DEPTHS:
        rollout = Rollout("bench", "bench", scenario.env, env=scenario.start, events=[*events, *calls[:depth]])
        for _ in range(repeats):
            began = time.perf_counter()
            result = replay(env, rollout)
            times[depth].append(time.perf_counter() - began)
            assert result.executable
    return times


# -- HTTP ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CallBody(TypedDict):
    """A call as a check or record request carries it (its output: what the simulator returned)."""

    tool: str
    arguments: Any  # the call's own
    output: NotRequired[Any]


def _call_json(call: Call, output: Any = None) -> CallBody:
    body: CallBody = {"tool": call.tool, "arguments": call.arguments}
    if output is not None:
        body["output"] = output
    return body


async def _http_sessions(
    scenario: Scenario, port: int, concurrent: int, rounds: int, think_s: float
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    import aiohttp

    times: dict[int, list[float]] = {d: [] for d in DEPTHS}
    served: dict[int, list[float]] = {d: [] for d in DEPTHS}  # the server's own time (Server-Timing)
    base = f"http://127.0.0.1:{port}"
    rng = random.Random(0)

    async def agent(http: aiohttp.ClientSession, index: int) -> None:
        for r in range(rounds):
            start = {"env": scenario.start, "rollout_id": f"b{index}-{r}"}
            async with http.post(f"{base}/sessions", json=start) as resp:
                sid = (await resp.json())["session"]
            for text in scenario.messages:
                async with http.post(f"{base}/sessions/{sid}/message", json={"role": "user", "content": text}) as resp:
                    await resp.read()
            for depth, call in zip(range(1, max(DEPTHS) + 1), scenario.calls(), strict=False):
                if think_s:
                    await asyncio.sleep(rng.uniform(0, 2 * think_s))  # the agent's model deciding the call
                began = time.perf_counter()
                async with http.post(f"{base}/sessions/{sid}/check", json={"call": _call_json(call)}) as resp:
                    verdict = orjson.loads(await resp.read())
                    timing = resp.headers["server-timing"]
                elapsed = time.perf_counter() - began
                if not verdict.get("valid"):
                    raise RuntimeError(f"bench {scenario.name} over HTTP: step {depth} is invalid: {verdict}")
                if depth in times:
                    times[depth].append(elapsed)
                    served[depth].append(float(timing.split("dur=")[1]) / 1000)
                body = {"call": _call_json(call, verdict["output"])}
                async with http.post(f"{base}/sessions/{sid}/record", json=body) as resp:
                    await resp.read()
            async with http.delete(f"{base}/sessions/{sid}") as resp:
                await resp.read()

    connector = aiohttp.TCPConnector(limit=concurrent)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(agent(http, i) for i in range(concurrent)))
    return times, served


def http(
    scenario: Scenario, concurrent: int, rounds: int, thinks: tuple[float, ...]
) -> list[tuple[dict[int, list[float]], dict[int, list[float]]]]:
    """Per think time, per depth, the seconds of each check request: at the client, and in the guard."""
    port = _free_port()
    pexec = str(Path(sys.executable).parent / "pexec")
    server = subprocess.Popen(
        [pexec, "guard", "serve", "--env", scenario.env, "--port", str(port), "--max-sessions", str(2 * concurrent)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the guard service did not start") from None
                time.sleep(0.2)
        asyncio.run(_http_sessions(scenario, port, concurrent, 1, 0))  # warm-up: the pool's environments
        return [asyncio.run(_http_sessions(scenario, port, concurrent, rounds, think)) for think in thinks]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def bench_guard(
    sessions: int = 400, concurrent: int = 50, rounds: int = 2, think_s: float = 0.5, repeats: int = 3
) -> Bench:
    """`think_s`: the mean pause of an HTTP agent before each check (0: back to back, the service saturated).
    The library and re-replay paths run `repeats` times (min–median–max of their percentiles), HTTP once."""
    load = os.getloadavg()[0]
    figures: list[Figure] = []
    details: dict[str, ScenarioTimes] = {}
    for scenario in SCENARIOS:
        library(scenario, 5)  # warm-up
        (paced, paced_served), (saturated, _) = http(scenario, concurrent, rounds, (think_s, 0.0))
        checks = [library(scenario, sessions) for _ in range(repeats)]
        prefixes = [rereplay(scenario, sessions) for _ in range(repeats)]
        details[scenario.name] = {"library": checks, "re-replay": prefixes, "http": paced, "saturated": saturated}
        http_paths = {
            f"HTTP, {concurrent} sessions pausing 0–{2 * think_s * 1000:g} ms": paced,
            "… of which in the guard (Server-Timing)": paced_served,
            f"HTTP, {concurrent} sessions back to back (saturated)": saturated,
        }
        for depth in DEPTHS:
            who = f"{scenario.name}, depth {depth}"
            for q in ("p50", "p99"):
                figures.append(figure(f"{who}: library check, {q}", "µs",
                                      [percentiles(t[depth])[f"{q}_us"] for t in checks], "re-replaying the prefix",
                                      [percentiles(t[depth])[f"{q}_us"] for t in prefixes]))  # fmt: skip
            for label, times in http_paths.items():
                figures.append(figure(f"{who}: {label}, p99", "µs", [percentiles(times[depth])["p99_us"]],
                                      "none: one implementation"))  # fmt: skip
    caption = (
        f"one check of the next valid call at session depth {', '.join(map(str, DEPTHS))}: {sessions} library "
        f"sessions per scenario, {n_runs(repeats)}; HTTP: {concurrent} sessions at once, {rounds} rounds, once; "
        f"{load_average(load)}"
    )
    return Bench("guard", caption, figures, details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=400, help="library sessions per scenario (shop)")
    parser.add_argument("--concurrent", type=int, default=50, help="HTTP sessions at once")
    parser.add_argument("--rounds", type=int, default=2, help="sessions per HTTP client")
    parser.add_argument("--think-ms", type=float, default=500.0, help="mean pause of an HTTP agent before a check")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    show(bench_guard(args.sessions, args.concurrent, args.rounds, args.think_ms / 1000, args.repeats))


if __name__ == "__main__":
    main()
