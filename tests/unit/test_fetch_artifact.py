"""ci/fetch_artifact.py, the Ascend jobs' fallback for actions/download-artifact inside a CANN container: against a
local server that answers as GitHub's REST API does (the listing, the archive URL redirecting to a storage host).
The clean twin extracts the artifact; a missing artifact, a refused token, a token sent on to the storage host and
a zip escaping its folder are each caught."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "fetch_artifact.py"
pytestmark = pytest.mark.torch_free


def _module():
    spec = importlib.util.spec_from_file_location("ci_fetch_artifact", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fetch_artifact = _module()


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in files.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture
def api():
    state = {"archive": _zip({"parity_harness-1.0-py3-none-any.whl": b"wheel", "sub/x.txt": b"x"}),
             "token_to_storage": False, "status": 200, "artifacts": ["parity-wheelhouse"],
             # the repository's listing (--previous): (artifact id, run id, branch, created_at); each id's archive
             "repository": [], "archives": {}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            base = f"http://127.0.0.1:{self.server.server_port}"
            if self.path.startswith("/storage/"):
                if "Authorization" in self.headers:
                    state["token_to_storage"] = True
                self.send_response(200)
                self.end_headers()
                blob = self.path.removeprefix("/storage/").removesuffix(".zip")
                self.wfile.write(state["archives"][blob] if blob in state["archives"] else state["archive"])
                return
            if self.headers.get("Authorization") != "Bearer t0ken" or state["status"] != 200:
                self.send_response(401)
                self.end_headers()
                return
            if self.path.startswith("/repos/o/r/actions/runs/7/artifacts"):
                body = {"artifacts": [{"name": n, "expired": False, "created_at": "2026-12-03T00:00:00Z",
                                       "archive_download_url": f"{base}/repos/o/r/actions/artifacts/1/zip"}
                                      for n in state["artifacts"]]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(data)
            elif self.path.startswith("/repos/o/r/actions/artifacts?name=parity-out-verl-main&"):
                body = {"artifacts": [{"name": "parity-out-verl-main", "expired": False, "created_at": created,
                                       "workflow_run": {"id": run, "head_branch": branch},
                                       "archive_download_url": f"{base}/repos/o/r/actions/artifacts/{aid}/zip"}
                                      for aid, run, branch, created in state["repository"]]}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(data)
            elif self.path.startswith("/repos/o/r/actions/artifacts/") and self.path.endswith("/zip"):
                blob = self.path.split("/")[-2]
                self.send_response(302)
                self.send_header("Location", f"{base}/storage/{'blob' if blob == '1' else blob}.zip")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"GITHUB_API_URL": f"http://127.0.0.1:{server.server_port}", "GITHUB_REPOSITORY": "o/r",
           "GITHUB_RUN_ID": "7", "GH_TOKEN": "t0ken", "GITHUB_REF_NAME": "main"}
    yield state, env
    server.shutdown()


def test_the_artifact_is_extracted_and_the_token_stays_with_the_api(api, tmp_path):
    state, env = api
    names = fetch_artifact.fetch("parity-wheelhouse", tmp_path / "wheelhouse", env)
    assert sorted(names) == ["parity_harness-1.0-py3-none-any.whl", "sub/x.txt"]
    assert (tmp_path / "wheelhouse" / "sub" / "x.txt").read_bytes() == b"x"
    assert state["token_to_storage"] is False


def test_a_missing_artifact_or_a_refused_token_is_named(api, tmp_path):
    state, env = api
    with pytest.raises(fetch_artifact.FetchError, match="no unexpired artifact named 'parity-goldens'"):
        fetch_artifact.fetch("parity-goldens", tmp_path / "g", env)
    state["status"] = 401
    with pytest.raises(fetch_artifact.FetchError, match="HTTP 401"):
        fetch_artifact.fetch("parity-wheelhouse", tmp_path / "w", env)
    with pytest.raises(fetch_artifact.FetchError, match="GH_TOKEN"):
        fetch_artifact.fetch("parity-wheelhouse", tmp_path / "w", {k: v for k, v in env.items() if k != "GH_TOKEN"})


def test_a_zip_member_outside_the_folder_is_refused(api, tmp_path):
    state, env = api
    state["archive"] = _zip({"../escape.txt": b"no"})
    with pytest.raises(fetch_artifact.FetchError, match="outside its folder"):
        fetch_artifact.fetch("parity-wheelhouse", tmp_path / "w", env)
    assert not (tmp_path / "escape.txt").exists()


def test_previous_takes_the_newest_earlier_run_on_this_branch(api, tmp_path):
    """The previous night's results (a lane's PARITY_PREVIOUS_OUT): newer artifacts of THIS run and of another
    branch are in the repository's listing too, and taking either would compare the night with itself or with a
    feature branch's."""
    state, env = api
    state["repository"] = [(11, 5, "main", "2026-12-01T02:00:00Z"), (12, 6, "main", "2026-12-02T02:00:00Z"),
                           (13, 7, "main", "2026-12-03T02:00:00Z"), (14, 8, "topic", "2026-12-03T03:00:00Z")]
    state["archives"] = {str(aid): _zip({"verl-main/results.jsonl": f"run {run}".encode()})
                         for aid, run, _, _ in state["repository"]}
    assert fetch_artifact.main(["--previous", "parity-out-verl-main"]) == 2  # usage
    fetch_artifact.fetch("parity-out-verl-main", tmp_path / "p", env, previous=True)
    assert (tmp_path / "p" / "verl-main" / "results.jsonl").read_text() == "run 6"
    assert state["token_to_storage"] is False
    # a first night: only this run's own artifact exists
    state["repository"] = [(13, 7, "main", "2026-12-03T02:00:00Z")]
    with pytest.raises(fetch_artifact.FetchError, match="no earlier run of o/r on main"):
        fetch_artifact.fetch("parity-out-verl-main", tmp_path / "q", env, previous=True)
