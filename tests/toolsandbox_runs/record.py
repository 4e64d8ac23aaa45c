"""Record run folders written by upstream ToolSandbox's own runner, its OpenAI agent and user roles answered by a
loopback stub model that plays scripted turns (scripts.py, stub_model.py).

Upstream: https://github.com/apple/ToolSandbox at commit 165848b9a78cead7ca7fe7c89c688b58e6501219 (the pinned
commit of tests/toolsandbox_diff/record.py), installed unchanged with pip from PyPI into its own virtual
environment (Python 3.11, the dependencies its pyproject.toml pins, plus httpx==0.27.2: openai 1.17.0 passes
`proxies=` to httpx.Client, which httpx 0.28 removed). Its command line (`tool_sandbox`, i.e.
tool_sandbox.cli:main) runs the scenarios with `--agent GPT_4_o_2024_05_13 --user GPT_4_o_2024_05_13`. Those
roles talk to https://api.openai.com/v1 (written into upstream's code); the process gets HTTPS_PROXY pointing at
the stub and SSL_CERT_FILE naming a CA made for this recording, so every request reaches the stub and nothing
leaves the machine. Scenarios whose first user messages coincide run in separate invocations, so there are
several run folders. The process runs with TZ=UTC in the upstream checkout (upstream records its git SHA).

How to re-record (about four minutes; installing the venv the first time takes five to ten more):

    git clone https://github.com/apple/ToolSandbox /tmp/ts-src   # or from any mirror of it
    git -C /tmp/ts-src checkout 165848b9a78cead7ca7fe7c89c688b58e6501219
    python3.11 tests/toolsandbox_runs/record.py --src /tmp/ts-src --venv /tmp/tsrun-venv

It creates the venv if it is missing, then replaces tests/toolsandbox_runs/runs.tar.gz (all run folders),
tests/data/toolsandbox (the run folder of scripts.SAMPLE, unpacked, for the manual's example) and PROVENANCE.json.
Upstream writes the current time into the logs, so a re-recording differs in timestamps and created ids, not in
shape.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scripts import SAMPLE, SCRIPTS  # noqa: E402
from stub_model import Routes, Script, StubServer  # noqa: E402

UPSTREAM = "https://github.com/apple/ToolSandbox"
COMMIT = "165848b9a78cead7ca7fe7c89c688b58e6501219"
EXTRA_PINS = ("httpx==0.27.2",)
ROLE = "GPT_4_o_2024_05_13"
PROBE = """
import json, sys
from tool_sandbox.common.execution_context import DatabaseNamespace, RoleType
from tool_sandbox.common.tool_discovery import ToolBackend
from tool_sandbox.scenarios import named_scenarios
wanted = set(json.loads(sys.argv[1]))
out = {}
for name, scenario in named_scenarios(preferred_tool_backend=ToolBackend.DEFAULT).items():
    if name not in wanted:
        continue
    rows = scenario.starting_context.get_database(DatabaseNamespace.SANDBOX).to_dicts()
    pick = lambda s, r: [x["content"] for x in rows if x["sender"] == s and x["recipient"] == r]
    out[name] = {"first": pick(RoleType.USER, RoleType.AGENT)[0],
                 "categories": [str(c) for c in scenario.categories]}
print(json.dumps(out))
"""


def install(src: Path, venv: Path, python: str) -> None:
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    if head.stdout.strip() != COMMIT:
        raise SystemExit(f"{src} is at {head.stdout.strip()}, not {COMMIT}")
    if (venv / "bin" / "tool_sandbox").exists():
        return
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", str(src), *EXTRA_PINS], check=True)
    shutil.rmtree(src / "build", ignore_errors=True)  # pip's build folder would count as a local change


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA for this recording and a certificate for api.openai.com it signs (openssl)."""
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=pexec recording CA",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=api.openai.com", "-keyout", str(key), "-out", str(csr))
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=DNS:api.openai.com\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2",
        "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


def probe(venv: Path, src: Path, names: list[str]) -> dict[str, dict]:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE, json.dumps(names)], cwd=src,
                          capture_output=True, text=True, check=True)  # fmt: skip
    found = json.loads(done.stdout)
    missing = sorted(set(names) - set(found))
    if missing:
        raise SystemExit(f"not upstream scenarios: {missing}")
    return found


def batches(scripts: tuple[Script, ...], keys: dict[str, dict]) -> list[list[Script]]:
    """The sample's scripts, then the others grouped so that no two in a group share the first user message."""
    groups: list[tuple[set[str], list[Script]]] = []
    for s in (s for s in scripts if s.scenario not in SAMPLE):
        mine = {keys[s.scenario]["first"]}
        group = next((g for g in groups if not g[0] & mine), None)
        if group is None:
            group = (set(), [])
            groups.append(group)
        group[0].update(mine)
        group[1].append(s)
    return [[s for s in scripts if s.scenario in SAMPLE], *(g[1] for g in groups)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True, help=f"a git checkout of {UPSTREAM} at {COMMIT}")
    parser.add_argument("--venv", type=Path, required=True, help="upstream's virtual environment (made if missing)")
    parser.add_argument("--python", default="python3.11", help="the interpreter for a new venv")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--data", type=Path, default=HERE.parent / "data" / "toolsandbox")
    args = parser.parse_args()
    src, venv = args.src.resolve(), args.venv.resolve()
    install(src, venv, args.python)
    keys = probe(venv, src, [s.scenario for s in SCRIPTS])
    work = Path(tempfile.mkdtemp(prefix="tsrun-"))
    ca, cert, key = certificates(work)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k != "SSL_CERT_DIR"}
    output = work / "runs"
    log = []
    for group in batches(SCRIPTS, keys):
        routes = Routes({keys[s.scenario]["first"]: s for s in group})
        server = StubServer(routes, str(cert), str(key))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        env |= {"HTTPS_PROXY": server.url, "SSL_CERT_FILE": str(ca), "OPENAI_API_KEY": "sk-stub-recording",
                "TZ": "UTC", "NO_PROXY": ""}  # fmt: skip
        command = [str(venv / "bin" / "tool_sandbox"), "--agent", ROLE, "--user", ROLE, "-p", "1",
                   "-o", str(output), "-s", *[s.scenario for s in group]]  # fmt: skip
        subprocess.run(command, cwd=src, env=env, check=True, stdout=subprocess.DEVNULL)
        server.shutdown()
        server.server_close()
        log.extend(routes.log)
    runs = sorted(p for p in output.iterdir() if p.is_dir())  # named by start time: the sample's first
    check(runs)
    write_outputs(runs, args.out, args.data, keys, log, venv)
    shutil.rmtree(work)


def check(runs: list[Path]) -> None:
    """Refuse a recording in which a scenario crashed other than its script says (a misrouted request, an
    unreachable stub) or is missing: it would be recorded as upstream's behaviour."""
    crashes = {
        entry["name"]: entry["exception_type"]
        for run in runs
        for entry in json.loads((run / "result_summary.json").read_text())["per_scenario_results"]
    }
    expected = {s.scenario: s.crash for s in SCRIPTS}
    if crashes != expected:
        wrong = sorted(set(crashes.items()) ^ set(expected.items()))
        raise SystemExit(f"the recording is not what the scripts say (scenario, exception): {wrong}")


def write_outputs(runs: list[Path], out: Path, data: Path, keys: dict[str, dict], log: list[dict],
                  venv: Path) -> None:  # fmt: skip
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for run in runs:
            for path in sorted(run.rglob("*")):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(run.parent)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if path.is_file():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    (out / "runs.tar.gz").write_bytes(buffer.getvalue())
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    shutil.copytree(runs[0], data / runs[0].name)
    freeze = subprocess.run([str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True, check=True)
    provenance = {
        "upstream": UPSTREAM,
        "commit": COMMIT,
        "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": f"tool_sandbox --agent {ROLE} --user {ROLE} -p 1 -o OUT -s SCENARIO...",
        "runs": [r.name for r in runs],
        "data_copy": runs[0].name,
        "scripts": {
            s.scenario: {
                "note": s.note,
                "crash": s.crash,
                "categories": keys[s.scenario]["categories"],
                "agent_turns": [type(t).__name__ for t in s.agent],
                "user_turns": [type(t).__name__ for t in s.user],
            }
            for s in SCRIPTS
        },
        "requests": log,
        "environment": sorted(line for line in freeze.stdout.splitlines() if not line.startswith("tool_sandbox")),
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1) + "\n")


if __name__ == "__main__":
    main()
