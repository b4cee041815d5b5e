#!/usr/bin/env python3
"""Download an artifact of THIS workflow run through GitHub's REST API, with the standard library only.

    python3 ci/fetch_artifact.py NAME DEST
    python3 ci/fetch_artifact.py --previous NAME DEST

The fallback of the Ascend jobs' `actions/download-artifact` step: those jobs run inside a CANN image on a
self-hosted runner, where a JavaScript action may not run (verl's Ascend jobs use none), and the image has no `gh`.
Reads GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_RUN_ID and GH_TOKEN (or GITHUB_TOKEN; the job needs `actions: read`).
Lists the run's artifacts named NAME, downloads the newest unexpired one's zip and extracts it into DEST. The token
goes to the API only, never to the storage host the archive URL redirects to. Exit 0: extracted; 1: not found or
refused (the message says which).

`--previous`: the previous night's artifact NAME instead, for a lane's PARITY_PREVIOUS_OUT (ci/nightly.sh): the
newest unexpired one the repository holds from an EARLIER run of this workflow on this branch (GITHUB_REF_NAME),
never this run's (`actions/download-artifact` reads only its own run's without a `run-id`). A lane's results expire
with their retention; a first night, or one after a month without runs, has none (exit 1, the lane runs without).
"""

from __future__ import annotations

import io
import json
import os
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path


class FetchError(RuntimeError):
    """The artifact could not be fetched (the message names it and why)."""


def _get(url: str, token: str, accept: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept, "X-GitHub-Api-Version": "2022-11-28"})
    request.add_unredirected_header("Authorization", f"Bearer {token}")  # not forwarded on redirect
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise FetchError(f"GET {url}: HTTP {exc.code} {exc.reason}") from None


def _earlier_run(artifact: dict, run: str, branch: str | None) -> bool:
    """An artifact of another run of this workflow on this branch (the listing is the repository's)."""
    origin = artifact.get("workflow_run") or {}
    return str(origin.get("id")) != run and (branch is None or origin.get("head_branch") == branch)


def fetch(name: str, dest: Path, env: dict[str, str], previous: bool = False) -> list[str]:
    """Extract artifact `name` of this run (`previous`: of the newest earlier run) into `dest`; returns the
    extracted names."""
    try:
        api, repo, run = env.get("GITHUB_API_URL", "https://api.github.com"), env["GITHUB_REPOSITORY"], \
            env["GITHUB_RUN_ID"]
    except KeyError as exc:
        raise FetchError(f"{exc.args[0]} is not set (this runs inside a GitHub Actions job)") from None
    token = env.get("GH_TOKEN") or env.get("GITHUB_TOKEN")
    if not token:
        raise FetchError("neither GH_TOKEN nor GITHUB_TOKEN is set (the step passes ${{ github.token }})")
    where = f"{api}/repos/{repo}/actions/artifacts" if previous else f"{api}/repos/{repo}/actions/runs/{run}/artifacts"
    listing = json.loads(_get(f"{where}?name={name}&per_page=100", token, "application/vnd.github+json"))
    found = [a for a in listing.get("artifacts", []) if a.get("name") == name and not a.get("expired")]
    if previous:
        found = [a for a in found if _earlier_run(a, run, env.get("GITHUB_REF_NAME"))]
    if not found:
        owner = f"no earlier run of {repo} on {env.get('GITHUB_REF_NAME') or 'any branch'}" if previous else \
            f"run {run} of {repo}"
        raise FetchError(f"{owner} has no unexpired artifact named {name!r}")
    newest = max(found, key=lambda a: a.get("created_at") or "")
    archive = _get(newest["archive_download_url"], token, "application/vnd.github+json")
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
            dest.mkdir(parents=True, exist_ok=True)
            for member in zipped.namelist():  # no member may land outside dest
                if Path(member).is_absolute() or ".." in Path(member).parts:
                    raise FetchError(f"artifact {name!r} holds a path outside its folder: {member}")
            zipped.extractall(dest)
            return zipped.namelist()
    except zipfile.BadZipFile:
        raise FetchError(f"artifact {name!r}: the download is not a zip archive") from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    previous = args[:1] == ["--previous"]
    args = args[1:] if previous else args
    if len(args) != 2:
        print("\n".join(line.strip() for line in __doc__.strip().splitlines()[2:4]), file=sys.stderr)
        return 2
    try:
        names = fetch(args[0], Path(args[1]), dict(os.environ), previous=previous)
    except FetchError as exc:
        # the previous night's results are optional: a notice, not an error annotation
        print(f"::{'notice' if previous else 'error'} title=artifact {args[0]}::{exc}")
        return 1
    print(f"{args[0]}: {len(names)} files into {args[1]} "
          f"({'the previous night' if previous else 'REST API fallback'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
