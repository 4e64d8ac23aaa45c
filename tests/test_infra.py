"""The image and the Kubernetes manifests: the Dockerfile passes hadolint and installs dependencies before
the code as a non-root user; the RayCluster and RayJob validate strictly against the pinned KubeRay CRD
schemas (infra/k8s/schemas, with provenance), the CronJob against Kubernetes' own with kubernetes-validate."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import ROOT

INFRA = ROOT / "infra"
BIN = Path(sys.executable).parent


def strict(schema: dict) -> dict:
    """The schema with undeclared fields refused wherever fields are declared (unless the schema keeps
    unknown fields): a misspelled key fails here instead of being dropped by the API server."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        return schema
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def kuberay(kind: str) -> dict:
    path = INFRA / "k8s" / "schemas" / f"kuberay-v1.7.0-{kind}.schema.json.gz"
    return strict(json.loads(gzip.decompress(path.read_bytes())))


def manifest(name: str) -> dict:
    return yaml.safe_load((INFRA / "k8s" / name).read_text())


def test_the_dockerfile_passes_hadolint():
    done = subprocess.run([str(BIN / "hadolint"), str(INFRA / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_installs_dependencies_before_the_code_and_runs_as_a_non_root_user():
    lines = [line for line in (INFRA / "Dockerfile").read_text().splitlines() if re.match(r"^[A-Z]+ ", line)]
    steps = [line.split()[0] for line in lines]
    lock = next(i for i, line in enumerate(lines) if "requirements.lock" in line and line.startswith("COPY"))
    code = next(i for i, line in enumerate(lines) if line.startswith("COPY") and " pipeline " in f"{line} ")
    assert lock < code and "RUN" in steps[lock:code]
    users = [line.split()[1] for line in lines if line.startswith("USER")]
    assert users[-1] not in ("0", "root")
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*") :] and "!.env" not in ignored  # everything is excluded unless listed


@pytest.mark.parametrize(("name", "kind"), [("raycluster.yaml", "raycluster"), ("rayjob.yaml", "rayjob")])
def test_kuberay_manifests_validate_against_the_pinned_crd_schema(name, kind):
    document = manifest(name)
    jsonschema.validate(document, kuberay(kind))
    cluster = document["spec"]["rayClusterSpec"] if kind == "rayjob" else document["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert all(g["maxReplicas"] > g["minReplicas"] for g in cluster["workerGroupSpecs"])


def test_a_misspelled_field_fails_the_schema():
    document = manifest("rayjob.yaml")
    document["spec"]["activeDeadlineSecond"] = document["spec"].pop("activeDeadlineSeconds")
    with pytest.raises(jsonschema.ValidationError, match="activeDeadlineSecond"):
        jsonschema.validate(document, kuberay("rayjob"))


def test_the_rayjob_has_a_deadline_a_backoff_limit_and_bucket_urls():
    spec = manifest("rayjob.yaml")["spec"]
    assert spec["activeDeadlineSeconds"] > 0 and spec["backoffLimit"] >= 1
    job_file = re.search(r"/opt/pexec/(jobs/\S+\.toml)", spec["entrypoint"]).group(1)
    text = (ROOT / job_file).read_text()
    assert re.search(r'^input = "s3://', text, re.M) and re.search(r'^output = "s3://', text, re.M)


def test_the_cronjob_validates_and_never_overlaps():
    done = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.34.0", str(INFRA / "k8s" / "nightly-cronjob.yaml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    spec = manifest("nightly-cronjob.yaml")["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] > 0
    assert "--wait" in spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
