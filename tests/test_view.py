"""`pexec view` over a real scored run: the pages' numbers against the run's Parquet read independently,
filters and keyset paging, the rollout page's steps and logged events, escaping, and refusals."""

from __future__ import annotations

import contextlib
import html
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import orjson
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import free_port, stop_group, wait_for
from starlette.testclient import TestClient
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.view import RunView, create_app
from pipeline.apps.view._queries import within
from pipeline.core.errors import RunIncomplete
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import part_facts
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

EVIL = '<script>alert("x")</script>'
PEXEC = str(Path(sys.executable).parent / "pexec")
SETTINGS = BootstrapSettings(B=20)


def make_run(folder: Path, storage_options: dict | None = None, root: str | None = None) -> str:
    """A synthetic shop store (one rollout labelled with markup) scored inline; returns the run's URL."""
    records = list(synthesize("shop", n_rollouts=240, n_tasks=30, seed=3))
    records[7]["labels"] = {**records[7]["labels"], "method": EVIL}
    records[7]["events"][0]["content"] += EVIL
    base = root or str(folder)
    write_store(iter(records), f"{base}/store", per_file=100, storage_options=storage_options)
    run_scoring(f"{base}/store", f"{base}/run", ScoreSettings(inline=True, storage_options=storage_options))
    return f"{base}/run"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_run(tmp_path_factory.mktemp("view"))


def store_of(run: str) -> tuple[str]:
    """The input store make_run scored `run` from, as RunView's `inputs` (what `--inputs` names)."""
    return (run.removesuffix("/run") + "/store",)


@pytest.fixture(scope="module")
def client(run: str) -> Iterator[TestClient]:
    view = RunView(open_run(run, None), SETTINGS, store_of(run))
    try:
        yield TestClient(create_app(view))
    finally:
        view.close()


def rollouts_table(run: str):
    return pq.read_table(f"{run}/rollouts")


def links(page: str, path: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(rf'href="({re.escape(path)}\?[^"]*)"', page)]


def count(page: str) -> int:
    return int(re.search(r'<p id="count"><strong>(\d+)</strong>', page).group(1))


def test_front_page_counts_are_the_runs(client: TestClient, run: str) -> None:
    table = rollouts_table(run)
    page = client.get("/").text
    assert "computed now from the rollouts" in page  # no metrics.parquet yet
    # Every cohort's n links to exactly the rollouts of that cohort; together they are the whole run.
    n_links = [html.unescape(h) for h in re.findall(r'class="n" href="([^"]*)"', page)]
    totals = [count(client.get(h).text) for h in n_links]
    assert sum(totals) == table.num_rows == 240
    expected = open_run(run).cohorts(None, SETTINGS)
    assert len(totals) == len(expected)
    assert sorted(totals) == sorted(c["n"] for c in expected)
    ter = expected[0]["ter"]
    assert f"{ter['value']:.3f} [{ter['lo']:.3f}, {ter['hi']:.3f}]" in page
    # TER links to the executable rollouts of its cohort: their number over n is the point estimate.
    ter_link = html.unescape(re.search(r'class="metric-ter" href="([^"]*)"', page).group(1))
    n_exec = count(client.get(ter_link).text)
    assert "fed=0" in ter_link and n_exec / expected[0]["n"] == pytest.approx(ter["value"])


def test_cause_link_lists_exactly_those_rollouts(client: TestClient, run: str) -> None:
    table = rollouts_table(run)
    page = client.get("/").text
    cause_links = [h for h in links(page, "/rollouts") if "cause=dependency" in h]
    assert cause_links
    listed = client.get(cause_links[0]).text
    q = dict(re.findall(r"label\.(\w+)=([^&]*)", cause_links[0]))
    mask = pc.equal(table["first_cause"], "dependency")
    for col, value in q.items():
        mask = pc.and_(mask, pc.equal(table[col], value))
    assert count(listed) == pc.sum(mask.cast("int64")).as_py() > 0


def test_filters_and_keyset_paging_cover_each_rollout_once(client: TestClient, run: str) -> None:
    table = rollouts_table(run)
    n_exec = pc.sum(table["executable"].cast("int64")).as_py()
    url: str | None = "/rollouts?fed=0"
    seen: list[str] = []
    while url:
        page = client.get(url).text
        assert count(page) == n_exec
        seen += re.findall(r'class="rollout" href="[^"]*">([^<]+)</a>', page)
        nxt = re.search(r'id="next" href="([^"]*)"', page)
        url = html.unescape(nxt.group(1)) if nxt else None
    expected = sorted(
        r for r, e in zip(table["rollout_id"].to_pylist(), table["executable"].to_pylist(), strict=True) if e
    )
    assert sorted(seen) == expected and len(seen) == len(set(seen)) and n_exec > 50  # more than one page
    failing = count(client.get("/rollouts?success=false&mismatch=0").text)
    assert failing == sum(s is False for s in table["success"].to_pylist())
    # The failing tool: the tool of each rollout's first invalid call, from the steps read independently.
    steps = pq.read_table(Path(run) / "steps").to_pylist()
    first_bad = {}
    for st in sorted(steps, key=lambda st: st["step"]):
        if not st["valid"]:
            first_bad.setdefault(st["rollout_id"], st["tool"])
    tool = max(set(first_bad.values()), key=list(first_bad.values()).count)
    assert count(client.get(f"/rollouts?tool={tool}").text) == list(first_bad.values()).count(tool) > 1


def test_rollout_page_shows_the_failing_step_and_the_logged_trajectory(client: TestClient, run: str) -> None:
    steps = pq.read_table(f"{run}/steps").to_pylist()
    bad = next(s for s in steps if not s["valid"])
    page = client.get("/rollouts?" + f"cause={bad['cause']}").text
    link = next(h for h in links(page, "/rollout") if f"id={bad['rollout_id']}&" in h)
    shown = client.get(link).text
    row = re.search(rf'<tr class="bad first-error" id="step-{bad["step"]}">(.*?)</tr>', shown, re.S)
    assert row is not None and bad["tool"] in row.group(1) and bad["cause"] in row.group(1)
    assert bad["detail"] == html.unescape(re.search(r"detail\">([^<]*)<", row.group(1)).group(1))
    # Events come from the input store: the user's first message and the call's arguments.
    assert 'id="input-note"' not in shown
    assert shown.count('<li class="call') == max(s["step"] for s in steps if s["rollout_id"] == bad["rollout_id"])
    assert '<li class="msg role-user">' in shown
    back = re.search(r'id="back" href="([^"]*)"', shown).group(1)
    assert f"cause={bad['cause']}" in html.unescape(back)


def test_text_from_logs_is_escaped(client: TestClient) -> None:
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    page = client.get("/").text
    assert EVIL not in page and escaped in page
    listed = client.get("/rollouts?" + urlencode({"label.method": EVIL})).text
    assert count(listed) == 1 and EVIL not in listed
    shown = client.get(links(listed, "/rollout")[0]).text  # the label and the user's message
    assert EVIL not in shown and shown.count(escaped) == 2


def test_stored_metrics_are_used_only_while_current(run: str, tmp_path: Path) -> None:
    # Stored with other settings than the viewer's (B=7): the page shows the stored numbers and says so.
    stored = open_run(run).cohorts(None, BootstrapSettings(B=7))
    open_run(run).write_metrics(stored)
    view = RunView(open_run(run, None), SETTINGS)
    try:
        page = TestClient(create_app(view)).get("/").text
        assert "metrics/metrics/metrics.parquet (task bootstrap, multinomial, B=7" in page
        ter = stored[0]["ter"]
        assert f"{ter['value']:.3f} [{ter['lo']:.3f}, {ter['hi']:.3f}]" in page
    finally:
        view.close()
    # A rescore after the metrics makes them stale: the viewer computes instead of showing old numbers.
    run_scoring(str(Path(run).parent / "store"), run, ScoreSettings(inline=True, force=True))
    view = RunView(open_run(run, None), SETTINGS)
    try:
        assert "computed now from the rollouts" in TestClient(create_app(view)).get("/").text
    finally:
        view.close()


def test_refusals_say_what_is_wrong(client: TestClient) -> None:
    r = client.get("/rollouts?label.nosuch=1")
    assert r.status_code == 400 and "unknown label column &#39;nosuch&#39;" in r.text
    r = client.get("/rollouts?label.fed=3")  # not a label: refused, not compared as text
    assert r.status_code == 400 and "unknown label column &#39;fed&#39;" in r.text
    r = client.get("/rollouts?fed=two")
    assert r.status_code == 400 and "fed must be a depth" in r.text
    for odd in ("²", "٣", "1234567890"):  # str.isdigit takes superscripts and other scripts' digits (a 500 before)
        r = client.get("/rollouts?" + urlencode({"fed": odd}))
        assert r.status_code == 400 and "fed must be a depth" in r.text
    r = client.get("/rollout?run=x&shard=../../etc&id=r1")
    assert r.status_code == 400 and "not a shard key" in r.text
    r = client.get("/rollout?run=x&shard=abc&id=r1")
    assert r.status_code == 400 and "no rollout" in r.text


def test_rollout_pages_of_one_shard_read_its_input_once(run: str) -> None:
    # Measured before: every rollout page decompressed its whole input file again (1.2-1.6 s at 40k rollouts).
    view = RunView(open_run(run, None), SETTINGS, store_of(run))
    try:
        client = TestClient(create_app(view))
        listed = links(client.get("/rollouts").text, "/rollout")
        shard = re.search(r"shard=([^&]+)", listed[0]).group(1)
        same_shard = [h for h in listed if f"shard={shard}&" in h or h.endswith(f"shard={shard}")][:3]
        assert len(same_shard) == 3
        pages = [client.get(html.unescape(link)).text for link in same_shard]
        assert all('<li class="msg role-user">' in page for page in pages)
        assert view.inputs_read == 1
    finally:
        view.close()


def test_a_changed_input_is_not_shown_as_the_scored_one(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    first = sorted((tmp_path / "store").rglob("*.jsonl*"))[0]
    first.write_bytes(first.read_bytes() + b"\n")
    view = RunView(open_run(run, None), SETTINGS, store_of(run))
    try:
        client = TestClient(create_app(view))
        listed = client.get("/rollouts").text
        page = client.get(links(listed, "/rollout")[0]).text
        assert "changed since the run scored it" in page and '<li class="call' not in page
        assert '<table id="steps">' in page  # the scored steps are still shown
    finally:
        view.close()


def test_a_run_on_object_storage(s3: dict, tmp_path: Path) -> None:
    run = make_run(tmp_path, s3, root="s3://pexec-test/view")
    view = RunView(open_run(run, s3), SETTINGS, store_of(run))
    try:
        client = TestClient(create_app(view))
        listed = client.get("/rollouts?fed=1").text
        assert count(listed) > 0
        page = client.get(links(listed, "/rollout")[0]).text
        assert 'class="bad first-error" id="step-1"' in page and '<li class="call bad">' in page
    finally:
        view.close()


@pytest.mark.server
def test_a_source_named_by_the_manifest_is_not_fetched(tmp_path: Path) -> None:
    # Measured before: the viewer sent GET, GET, HEAD to any URL a run's manifest named as a shard's source.
    run = make_run(tmp_path)
    asked: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(f"GET {self.path}")
            self.send_error(404)

        def do_HEAD(self) -> None:
            asked.append(f"HEAD {self.path}")
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/internal/data.jsonl"
        manifest = Path(run) / "_manifest.json"
        local = str(tmp_path / "store")
        manifest.write_text(manifest.read_text().replace(local, url.removesuffix("/data.jsonl")))
        plan = Path(run) / "_plan.json"
        if plan.exists():
            plan.write_text(plan.read_text().replace(local, url.removesuffix("/data.jsonl")))
        for inputs in [(), (local,)]:  # outside the places given, whatever they are
            view = RunView(open_run(run, None), SETTINGS, inputs)
            try:
                client = TestClient(create_app(view))
                page = client.get(links(client.get("/rollouts").text, "/rollout")[0]).text
            finally:
                view.close()
            assert "the input is not read" in page and "/internal" in page and '<li class="call' not in page
            assert '<table id="steps">' in page  # the scored steps are still shown
        assert asked == []
        view = RunView(open_run(run, None), SETTINGS, (f"http://127.0.0.1:{server.server_address[1]}/internal",))
        try:  # named with --inputs, it is read (and here not found)
            client = TestClient(create_app(view))
            page = client.get(links(client.get("/rollouts").text, "/rollout")[0]).text
        finally:
            view.close()
        assert asked and "the input is not read" not in page
    finally:
        server.shutdown()


def test_a_place_holds_what_lies_below_it_only() -> None:
    assert within("/data/store/part-1.jsonl", "/data/store") and within("/data/store", "/data/store/")
    assert not within("/data/store2/x", "/data/store") and not within("/data/store/../secret", "/data/store")
    assert within("s3://b/run/x", "s3://b/run") and not within("s3://b/run/../other/x", "s3://b/run")
    assert not within("http://evil.example/x", "/data") and not within("s3://b/runs", "s3://b/run")
    assert within("file:///data/store/x", "/data/store")


def recommit(run: Path) -> None:
    """Record the parts as they are now in the run's markers and manifest (a reader refuses a part that is not
    the one its marker recorded)."""
    for path in [run / "_manifest.json", *run.glob("_shards/*.json")]:
        doc = orjson.loads(path.read_bytes())
        for marker in doc.get("shards", [doc]):
            for table_name in marker["parts"]:
                facts = part_facts(str(run), table_name, marker["shard"])
                marker["parts"][table_name], marker["part_rows"][table_name] = facts.size, facts.rows
                marker["part_digests"][table_name] = facts.digest
        path.write_bytes(orjson.dumps(doc))


def test_status_filter(run: str, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for part in (copy / "rollouts").glob("*.parquet"):
        table = pq.read_table(part)
        status = ["harness_error" if i % 7 == 0 else "ok" for i in range(table.num_rows)]
        pq.write_table(table.set_column(table.schema.get_field_index("status"), "status", pa.array(status)), part)
    recommit(copy)
    view = RunView(open_run(str(copy), None), SETTINGS)
    try:
        client = TestClient(create_app(view))
        expected = sum(1 for s in pq.read_table(copy / "rollouts")["status"].to_pylist() if s == "harness_error")
        page = client.get("/rollouts?status=harness_error").text
        assert count(page) == expected > 0 and '<th class="key">status</th>' in page
    finally:
        view.close()


def test_cli_refuses_a_missing_run_and_a_busy_port(run: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["view", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no run at" in result.output
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["view", run, "--port", str(port), "--bootstrap", "20"])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output


def test_an_incomplete_run_only_with_partial_and_saying_so(run: str, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "_manifest.json").unlink()  # scoring did not finish
    with pytest.raises(RunIncomplete, match="--partial"):
        RunView(open_run(str(copy), None), SETTINGS)
    view = RunView(open_run(str(copy), None, True), SETTINGS)
    try:
        page = TestClient(create_app(view)).get("/rollouts").text
        assert 'id="partial"' in page and "of 3 shards" in page
    finally:
        view.close()


def test_beyond_loopback_the_viewer_needs_a_token(run: str, monkeypatch) -> None:
    # Measured before: `pexec view RUN --host 0.0.0.0` served every trajectory and user message to anyone.
    monkeypatch.delenv("PEXEC_VIEW_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["view", run, "--host", "0.0.0.0", "--port", str(free_port())])
    assert result.exit_code == 2 and "refusing to listen on 0.0.0.0 without a bearer token" in result.output


@pytest.mark.server
def test_the_served_viewer_checks_token_host_and_origin(run: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("v13w-token\n")
    port = free_port()
    command = [PEXEC, "view", run, "--port", str(port), "--token-file", str(token_file), "--bootstrap", "20"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def get(path: str, **headers: str) -> tuple[int, dict, str]:
        request = urllib.request.Request(base + path, headers=headers)
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode()

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode())
        try:
            return get("/")[0] == 401
        except OSError:
            return False

    try:
        wait_for(up, 90, "the viewer")
        assert "v13w-token" not in " ".join(psutil.Process(proc.pid).cmdline())  # not in the process list
        status, headers, _ = get("/rollouts?fed=0&token=v13w-token")  # the link a user is given
        assert status == 303 and headers["location"] == "/rollouts?fed=0"
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        assert get("/rollouts?fed=0", Cookie=cookie)[0] == 200
        assert get("/", Authorization="bearer v13w-token")[0] == 200
        assert get("/", Cookie="pexec_token=wrong")[0] == 401
        status, _, body = get("/", Cookie=cookie, Host="attacker.example")  # DNS rebinding
        assert status == 403 and "is not an address this service serves" in body
        status, _, body = get("/", Cookie=cookie, Origin="http://attacker.example")
        assert status == 403 and "cross-origin request" in body
    finally:
        stop_group(proc)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # the 303 itself is what the test reads
        return None


SECRET = "pl4nted-s3cret-Zq9"  # a storage credential that must reach no repr, page or log line


def test_no_page_repr_or_log_carries_a_credential(s3: dict, tmp_path: Path) -> None:
    # Measured before: every page's header was the run handle's repr, storage options (key, secret) included,
    # and a Python dump of every file of the run.
    options = {**s3, "key": "AKIAPLANTEDKEY", "secret": SECRET}
    run = make_run(tmp_path, options, root="s3://pexec-test/secret-view")
    opened = open_run(run, options)
    shown = [repr(opened), str(opened), repr(opened.snapshot), repr(opened.snapshot.root)]
    assert all(SECRET not in s and "AKIAPLANTEDKEY" not in s for s in shown)
    assert repr(opened) == f"Run('{run}', complete: 3 shards, 240 rollouts)"
    view = RunView(opened, SETTINGS)
    try:
        client = TestClient(create_app(view))
        pages = [client.get(u) for u in ("/", "/rollouts", "/rollouts?fed=bogus", "/rollout?run=x", "/nowhere")]
        pages.append(client.get(links(pages[1].text, "/rollout")[0]))
    finally:
        view.close()
    assert [p.status_code for p in pages] == [200, 200, 400, 400, 404, 200]
    for page in pages:
        for leak in (SECRET, "AKIAPLANTEDKEY", "Run(", "Snapshot(", "object at 0x", "frozenset"):
            assert leak not in page.text, (page.url, leak)
    header = re.search(r"<header>(.*?)</header>", pages[0].text).group(1)
    assert f'<span class="run">{run}</span>' in header and "complete: 3 shards, 240 rollouts" in header
    # The served viewer's own output (banner, request log) as a user sees it.
    port = free_port()
    command = [PEXEC, "view", run, "--port", str(port), "--bootstrap", "20", "--endpoint-url", s3["endpoint_url"]]
    command += ["--storage-option", "key=AKIAPLANTEDKEY", "--storage-option", f"secret={SECRET}"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _serves(port), 60, "the viewer")
        for path in ("/", "/rollouts", "/rollouts?fed=bogus"):
            with contextlib.suppress(urllib.error.HTTPError):  # the refused one is read too
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
    assert "127.0.0.1" in output and SECRET not in output and "AKIAPLANTEDKEY" not in output


def _serves(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_a_url_is_shown_without_its_credentials() -> None:
    from pipeline.core.text import public_url

    assert public_url("s3://bucket/runs/a") == "s3://bucket/runs/a"
    assert public_url("/tmp/run") == "/tmp/run"
    assert public_url("s3://KEY:SECRET@bucket/run") == "s3://***@bucket/run"
    assert public_url("https://u:tok@host:9000/run?X-Amz-Signature=abc") == "https://***@host:9000/run?***"
