"""The MCP proxy's log (`pexec guard mcp --log FOLDER`): every event appended to the session's journal as it
happens, `FOLDER/.journal/<id>.jsonl` (a dot folder, not part of the store), one line each and never rewritten;
the canonical rollout `FOLDER/<id>.jsonl` written once, atomically, when the session ends. A journal left by a
killed proxy is turned into its rollout when the next proxy opens the folder.

Journal lines: `{"start": record without events}`, `{"event": canonical event}` (a call with its live verdict
under `guard`), `{"note": {...}}` (kept for the audit only: a refused unreadable request), `{"end": attributes}`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson

from pipeline.core.model import Call, Message, Rollout
from pipeline.core.records import event_record

JOURNAL = ".journal"


class LiveVerdict(TypedDict):
    """A call's verdict when the proxy checked it, kept with the call under `guard`."""

    valid: bool
    check: str | None  # the failed check (S, D or P); None when valid
    cause: str | None
    schema: Literal["spec", "upstream"] | None  # whose schema decided S; None: the tool has neither


def _rollout_record(rollout: Rollout, events: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "benchmark": "observed",
        "labels": rollout.labels,
        "attributes": rollout.attributes,
        "env": rollout.env,
        "events": events,
    }


class RolloutLog:
    """The session's log: every event appended to its journal as it happens (one line each, flushed), the
    canonical rollout written once at the end (`close`)."""

    def __init__(self, folder: str, rollout: Rollout) -> None:
        self.folder = Path(folder)
        recover_journals(self.folder)
        (self.folder / JOURNAL).mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{rollout.rollout_id}.jsonl"
        self.journal_path = self.folder / JOURNAL / f"{rollout.rollout_id}.jsonl"
        self._journal = self.journal_path.open("ab")
        self._rollout = rollout
        self._append({"start": _rollout_record(rollout, [])})

    def _append(self, line: dict[str, object]) -> None:
        self._journal.write(orjson.dumps(line) + b"\n")
        self._journal.flush()

    def event(self, event: Call | Message, verdict: LiveVerdict | None = None) -> None:
        record = event_record(event)
        if verdict is not None:
            record["guard"] = verdict
        self._append({"event": record})

    def note(self, **fields: object) -> None:
        """A journal-only line (a refused unreadable request, the upstream's death): kept for the audit, and
        summed into the rollout's attributes."""
        self._append({"note": fields})

    def close(self, attributes: dict[str, str]) -> None:
        if self._journal.closed:
            return
        self._append({"end": attributes})
        self._journal.close()
        _write_rollout(self.journal_path, self.path)


def _write_rollout(journal: Path, target: Path) -> None:
    """The canonical rollout of a journal, written atomically (a dot file until complete), then the journal
    removed."""
    record: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    attributes: dict[str, str] = {}
    for raw in journal.read_bytes().splitlines():
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a line cut short by a kill: the events before it stand
        if "start" in line:
            record = line["start"]
        elif "event" in line:
            events.append(line["event"])
        elif "end" in line:
            attributes.update(line["end"])
    if record is None:
        journal.unlink(missing_ok=True)
        return
    record["events"] = events
    record["attributes"] = {**record.get("attributes", {}), **attributes}
    tmp = target.parent / f".{target.name}.tmp"
    tmp.write_bytes(orjson.dumps(record) + b"\n")
    os.replace(tmp, target)
    journal.unlink(missing_ok=True)


def recover_journals(folder: Path) -> None:
    """Turn the journals a killed proxy left into their rollouts."""
    for journal in sorted((folder / JOURNAL).glob("*.jsonl")):
        _write_rollout(journal, folder / journal.name)
