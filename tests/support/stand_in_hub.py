"""A stand-in Hugging Face hub on loopback: the two calls huggingface_hub's `snapshot_download` makes for a model,
answered from checkpoint folders, so the download path runs for real without the network.

- `GET /api/models/{repo}/revision/{revision}`: the revision's commit (`sha`) and its files (`siblings`).
- `HEAD` and `GET /{repo}/resolve/{commit}/{path}`: a file, with the headers the client checks (`X-Repo-Commit`,
  `ETag`, `Content-Length`).

Point `HF_ENDPOINT` (or `HubAccess.endpoint`) at `url`. Unknown repositories and revisions answer as the hub does
(404 with the `X-Error-Code` huggingface_hub turns into RepositoryNotFoundError / RevisionNotFoundError).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.support.hub_models import checkpoint_files, sha256_of


@dataclass
class HubRepo:
    """One model repository: its commits (commit -> checkpoint folder) and its refs (branch or tag -> commit)."""

    commits: dict[str, Path] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


class StandInHub:
    """The server, in a thread of the test's process; `requests` lists every (method, path) it was asked."""

    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def files_sent(self) -> list[str]:
        """The paths of the files it sent (GET of a file, not the HEAD before it)."""
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]


def _handler_for(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def log_message(self, *args) -> None:  # quiet: the test reads `hub.requests`
            pass

        def _answer(self, with_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            if path.startswith("/api/models/"):
                self._revision_info(path.removeprefix("/api/models/"))
            elif "/resolve/" in path:
                self._file(path.lstrip("/"), with_body)
            else:
                self._error(404, "EntryNotFound")

        def _revision_info(self, rest: str) -> None:
            repo_id, _, revision = rest.partition("/revision/")
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound")
            commit = repo.commit_of(revision or "main")
            if commit is None:
                return self._error(404, "RevisionNotFound")
            siblings = [{"rfilename": name} for name in checkpoint_files(repo.commits[commit])]
            self._send(200, json.dumps({"id": repo_id, "sha": commit, "siblings": siblings}).encode(),
                       {"Content-Type": "application/json"}, with_body=True)

        def _file(self, rest: str, with_body: bool) -> None:
            repo_id, _, tail = rest.partition("/resolve/")
            revision, _, name = tail.partition("/")
            repo = hub.repos.get(repo_id)
            commit = repo.commit_of(revision) if repo is not None else None
            if commit is None:
                return self._error(404, "RepoNotFound" if repo is None else "RevisionNotFound")
            source = repo.commits[commit] / name
            if not source.is_file():
                return self._error(404, "EntryNotFound", commit)
            headers = {"X-Repo-Commit": commit, "ETag": f'"{sha256_of(source)}"',
                       "Content-Type": "application/octet-stream"}
            self._send(200, source.read_bytes(), headers, with_body)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "Content-Type": "application/json"}
            if commit is not None:
                headers["X-Repo-Commit"] = commit
            self._send(status, json.dumps({"error": code}).encode(), headers, with_body=self.command != "HEAD")

        def _send(self, status: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

    return Handler
