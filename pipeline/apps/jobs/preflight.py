"""`pexec run --check JOB`: what a job needs, checked before any scoring — its input store can be listed
(credentials, bucket, files), its output's bucket or folder exists and can be written, its environments and
spec resolve, and its `by` columns are labels or attributes of the input. Every problem is reported, on one line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from pipeline.apps.jobs.definition import Job, absolute_paths, raw_input
from pipeline.core import run_schema
from pipeline.core.errors import PexecError, PreflightError
from pipeline.core.records import parse_rollout
from pipeline.envs import get_environment
from pipeline.envs.spec.loader import find_spec
from pipeline.ingest.sharded import plan_raw, read_raw
from pipeline.metrics.cohorts import resolve_by
from pipeline.storage.fs import exists, filesystem, is_local
from pipeline.storage.inputs import list_inputs, read_shard
from pipeline.storage.shards import Shard

SAMPLE = 1000  # rollouts read from the first input file to find labels and benchmarks


@dataclass(frozen=True)
class JobCheck:
    files: int  # data files in the input (0: the job synthesizes it)
    megabytes: float
    environments: list[str]
    labels: list[str]  # label columns seen in the sampled rollouts


def check_job(job: Job) -> JobCheck:
    job = absolute_paths(job)
    problems: list[str] = []
    options = job.storage_options
    files: list[Any] = []
    sample: list[Any] = []
    try:
        source = raw_input(job)
        if source is not None and source.fmt != "canonical":
            shards = plan_raw(source, job.scoring.shard_bytes)
            files = list({s.file.url: s.file for s in shards}.values())
            # a shuffled format's first shard holds no whole rollout: no sample (the run checks its labels)
            records = () if source.shuffle else islice(read_raw(source, shards[0]), SAMPLE)
            sample = [parse_rollout(r) for _, r in records if isinstance(r, dict)]
        elif job.synth is None or exists(job.input, options):
            files, _ = list_inputs(job.input, options)
            records = islice(read_shard(Shard(files[0], 0, None), options), SAMPLE)
            sample = [parse_rollout(r) for _, r in records if isinstance(r, dict)]
    except Exception as exc:  # the store's own errors: bucket, credentials, endpoint, bad records
        problems.append(_one_line("input", exc))
    problems += _output_problems(job.output, options)
    if job.report is not None:
        problems += _output_problems(job.report.out, options, "[report] out")
    scoring = job.scoring
    names = [scoring.env] if scoring.env else sorted({r.benchmark for r in sample})
    if job.synth is not None and not sample and not scoring.env:
        names = [job.synth.get("spec", "shop")]
    for name in names:
        try:
            get_environment(name, scoring.env_options)
        except PexecError as exc:
            problems.append(_one_line(f"environment {name!r}", exc))
    if scoring.spec and find_spec(scoring.spec, scoring.spec_dirs) is None:
        problems.append(f"spec {scoring.spec!r} is not installed (nor in spec_dirs)")
    labels = sorted({key for r in sample for key in r.labels})
    attributes = sorted({run_schema.ATTRIBUTE_PREFIX + key for r in sample for key in r.attributes})
    if sample and job.metrics.by:
        try:
            resolve_by(job.metrics.by, labels, attributes)
        except PexecError as exc:
            problems.append(_one_line(f"[metrics] by (labels of the first {len(sample)} rollouts)", exc))
    if problems:
        raise PreflightError(f"job {job.name} cannot run: " + "; ".join(problems))
    return JobCheck(len(files), sum(f.size for f in files) / 2**20, names, labels)


def _output_problems(url: str, options: dict[str, Any] | None, name: str = "output") -> list[str]:
    try:
        fs, path = filesystem(url, options)
        if is_local(fs):
            existing = Path(path)
            while not existing.exists():
                existing = existing.parent
            return [] if os.access(existing, os.W_OK) else [f"{name}: {existing} is not writable"]
        bucket = path.split("/", 1)[0]
        return [] if fs.exists(bucket) else [f"{name}: bucket {bucket!r} does not exist ({url})"]
    except Exception as exc:  # credentials, endpoint, permissions
        return [_one_line(name, exc)]


def _one_line(what: str, exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{what}: {text}" if isinstance(exc, PexecError) else f"{what}: {type(exc).__name__}: {text}"
