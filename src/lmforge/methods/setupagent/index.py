"""A date-capped local package index: PEP 503/691 "simple" pages with PEP 700 upload times, served
on 127.0.0.1, plus a tiny wheel builder.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) installs each instance's
dependencies "historically accurately", i.e. as they were when the change was made. lmforge does
this by resolving against an index whose files carry upload times and asking the installer to
ignore files uploaded after the instance's ``created_at``. :class:`LocalIndex` is that index for
offline runs and tests: it serves the wheels and sdists of one folder over HTTP
(``http.server`` in a thread, port chosen by the OS), with

* ``/simple/`` and ``/simple/<project>/`` in PEP 691 JSON (``application/vnd.pypi.simple.v1+json``,
  API version 1.1, PEP 700 ``upload-time``, ``size`` and ``versions``) when the client's
  ``Accept`` header (or ``?format=``) prefers it, else PEP 503 HTML;
* every file's ``sha256`` (JSON ``hashes``, HTML URL fragment);
* upload times from a sidecar JSON map ``{filename: ISO 8601 time}`` (default
  ``upload-times.json`` in the folder). PEP 700 puts ``upload-time`` in the JSON API only; the
  HTML pages cannot carry it.

Libraries checked for an existing implementation: ``pypiserver`` and ``devpi-server`` serve
folders but take upload times from file mtimes / their own database, not a given map, and are not
installed here; ``simple-repository-server`` needs FastAPI; ``devpi-timemachine`` and
``pypi-timemachine`` proxy PyPI (network). pip's own index code (``pip._internal.index``) is a
client. The server and :func:`build_wheel` are written here on the standard library.

NOTE (historical-accuracy mechanism): the paper says its environments are historically accurate;
the exact mechanism was not found in the paper text available here (searches of the stored pages
and docs returned only the abstract), so it is unconfirmed. Two standard mechanisms read PEP 700
upload times from an index: pip's ``--uploaded-prior-to DATETIME`` (pip >= 26.0 per secondary
sources, pypa/pip PR #13520; pip 26.3 is installed here and has it; pip refuses to install from an
index that gives no upload time when the option is set) and ``uv pip ... --exclude-newer``. lmforge
uses pip's, because pip is present in every virtual environment it creates; ``uv`` is the
cross-check the issue asks for.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import json
import re
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from lmforge.common.errors import UserError

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
API_VERSION = "1.1"
UPLOAD_TIMES_FILE = "upload-times.json"
_ARCHIVES = (".whl", ".tar.gz", ".zip")


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(name: str) -> str:
    # the distribution part of a wheel or dist-info name (PEP 427 / binary distribution format)
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(name: str, version: str, files: Mapping[str, str | bytes], out_dir: str | Path, *,
                requires: tuple[str, ...] | list[str] = (), requires_python: str | None = None,
                tag: str = "py3-none-any") -> Path:
    """Write a pure-Python wheel ``{name}-{version}-{tag}.whl`` into ``out_dir`` and return its path.

    Args:
        name, version: the distribution's name and version.
        files: ``{path inside the wheel: text or bytes}``, e.g. ``{"toydep/__init__.py": "..."}``.
        requires: ``Requires-Dist`` lines.
        requires_python: ``Requires-Python``, if any.
        tag: the wheel's compatibility tag.

    The zip is deterministic (fixed timestamps, sorted entries); ``.dist-info/METADATA``,
    ``WHEEL`` and ``RECORD`` (with sha256 and sizes) are generated.
    """
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise UserError(f"not a valid distribution name: {name!r}")
    if not re.fullmatch(r"[A-Za-z0-9.+!_-]+", version):
        raise UserError(f"not a valid version: {version!r}")
    dist = _wheel_name(name)
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    wheel = ["Wheel-Version: 1.0", "Generator: lmforge", "Root-Is-Purelib: true", f"Tag: {tag}"]
    entries: dict[str, bytes] = {}
    for path, content in sorted(files.items()):
        if path.startswith("/") or ".." in path.split("/") or path.startswith(info):
            raise UserError(f"bad path inside a wheel: {path!r}")
        entries[path] = content.encode() if isinstance(content, str) else bytes(content)
    entries[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    entries[f"{info}/WHEEL"] = ("\n".join(wheel) + "\n").encode()
    return _write_wheel(Path(out_dir) / f"{dist}-{version}-{tag}.whl", info, entries)


def _write_wheel(target: Path, info: str, entries: dict[str, bytes]) -> Path:
    """Zip ``entries`` (RECORD generated) deterministically into ``target``."""
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in entries.items():
        writer.writerow([path, _record_hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    entries[f"{info}/RECORD"] = record.getvalue().encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in entries.items():
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return target


_NOT_REPACKED = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


def wheel_from_installed(name: str, out_dir: str | Path) -> Path:
    """Re-pack an installed pure-Python distribution as a wheel (e.g. pip or pytest for an offline
    index), from the files its ``RECORD`` lists.

    Kept: the files inside the install root (no ``../`` scripts, which pip regenerates from
    ``entry_points.txt``) and the ``.dist-info`` metadata as installed (``METADATA``, ``WHEEL``,
    ``entry_points.txt``, licences), without ``__pycache__``; ``RECORD`` is rebuilt. A
    distribution that is not pure (``Root-Is-Purelib: false``) or whose files are missing is a
    UserError. ``pip wheel`` cannot do this offline: it rebuilds from the source, not the install.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise UserError(f"distribution {name!r} is not installed") from None
    files = dist.files
    if not files:
        raise UserError(f"distribution {name!r} has no RECORD to re-pack")
    dist_name, version = dist.metadata["Name"], dist.version
    wheel_text = dist.read_text("WHEEL") or ""
    if "Root-Is-Purelib: true" not in wheel_text:
        raise UserError(f"distribution {name!r} is not a pure-Python wheel; it cannot be re-packed")
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    tag = tags[0] if len(tags) == 1 else "py3-none-any"
    info = ""
    entries: dict[str, bytes] = {}
    for item in files:
        parts = item.parts
        if not parts or parts[0] == ".." or "__pycache__" in parts or item.suffix == ".pyc":
            continue
        if parts[0].endswith(".dist-info"):
            info = parts[0]
            if len(parts) == 2 and parts[1] in _NOT_REPACKED:
                continue
        path = Path(item.locate())
        try:
            entries[item.as_posix()] = path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read {path} of {name!r}: {exc}") from None
    if not info:
        raise UserError(f"distribution {name!r} lists no .dist-info folder")
    return _write_wheel(Path(out_dir) / f"{_wheel_name(dist_name)}-{version}-{tag}.whl", info, entries)


# -------------------------------------------------------------------------------------- the index


def _parse_time(value: Any, filename: str) -> datetime:
    if not isinstance(value, str):
        raise UserError(f"upload time of {filename} is not a string: {value!r}")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise UserError(f"upload time of {filename} is not ISO 8601: {value!r}") from None
    if when.tzinfo is None:
        raise UserError(f"upload time of {filename} has no time zone (write it in UTC, ...Z): {value!r}")
    return when.astimezone(timezone.utc)


def format_time(when: datetime) -> str:
    """PEP 700's form: ``yyyy-mm-ddThh:mm:ss[.ffffff]Z`` in UTC."""
    when = when.astimezone(timezone.utc)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}"
    return text + "Z"


def _project_and_version(filename: str) -> tuple[str, str]:
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        if len(parts) < 5:
            raise UserError(f"not a wheel file name: {filename}")
        return normalize(parts[0]), parts[1]
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    if "-" not in stem:
        raise UserError(f"not an sdist file name (NAME-VERSION.tar.gz): {filename}")
    name, version = stem.rsplit("-", 1)
    return normalize(name), version


@dataclass(frozen=True)
class IndexFile:
    """One served file."""

    filename: str
    project: str
    version: str
    sha256: str
    size: int
    upload_time: datetime | None
    path: Path


def scan_folder(folder: str | Path, upload_times: Mapping[str, str] | str | Path | None = None) -> list[IndexFile]:
    """The wheels and sdists of ``folder`` with their hashes and upload times.

    ``upload_times``: a ``{filename: ISO 8601}`` map, a path to one as JSON, or None for
    ``folder/upload-times.json`` when it exists (else no file has an upload time). A time for a
    file that is not in the folder, or one without a time zone, is a UserError.
    """
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"index folder not found: {root}")
    if upload_times is None:
        sidecar = root / UPLOAD_TIMES_FILE
        upload_times = sidecar if sidecar.is_file() else {}
    if isinstance(upload_times, (str, Path)):
        try:
            upload_times = json.loads(Path(upload_times).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read upload times {upload_times}: {exc}") from None
        if not isinstance(upload_times, dict):
            raise UserError("upload times must be a JSON object {filename: time}")
    names = sorted(p.name for p in root.iterdir() if p.is_file() and p.name.endswith(_ARCHIVES))
    unknown = sorted(set(upload_times) - set(names))
    if unknown:
        raise UserError(f"upload time given for a file not in {root}: {unknown[0]}")
    out = []
    for name in names:
        data = (root / name).read_bytes()
        project, version = _project_and_version(name)
        when = _parse_time(upload_times[name], name) if name in upload_times else None
        out.append(IndexFile(name, project, version, hashlib.sha256(data).hexdigest(), len(data), when, root / name))
    return out


def _accepts(header: str | None) -> dict[str, float]:
    prefs: dict[str, float] = {}
    for part in (header or "").split(","):
        bits = [b.strip() for b in part.split(";")]
        if not bits[0]:
            continue
        q = 1.0
        for b in bits[1:]:
            if b.startswith("q="):
                try:
                    q = float(b[2:])
                except ValueError:
                    q = 0.0
        prefs[bits[0].lower()] = max(q, prefs.get(bits[0].lower(), 0.0))
    return prefs


def choose_format(accept: str | None) -> str:
    """``json`` or ``html`` for an ``Accept`` header (PEP 691 negotiation): the served type with
    the highest q; ties and no header go to HTML (PEP 503 clients send none)."""
    prefs = _accepts(accept)
    q_json = max(prefs.get(JSON_TYPE, 0.0), prefs.get("application/vnd.pypi.simple.latest+json", 0.0))
    q_html = max(prefs.get(HTML_TYPE, 0.0), prefs.get("application/vnd.pypi.simple.latest+html", 0.0),
                 prefs.get("text/html", 0.0), prefs.get("*/*", 0.0))
    if not prefs:
        return "html"
    return "json" if q_json > q_html else "html"


class LocalIndex:
    """A simple index of one folder on ``http://127.0.0.1:PORT/simple/``; a context manager.

    Args:
        folder: the wheels/sdists.
        upload_times: see :func:`scan_folder`.
        serve_json: False serves HTML only (an index without upload times to a date-capped pip).

    ``url`` is the index URL (for ``--index-url``) once started; ``requests`` counts the requests
    served. The folder is read once, at start.
    """

    def __init__(self, folder: str | Path, upload_times: Mapping[str, str] | str | Path | None = None,
                 *, serve_json: bool = True) -> None:
        self.folder = Path(folder)
        self.files = scan_folder(folder, upload_times)
        self.serve_json = serve_json
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- pages
    @property
    def projects(self) -> list[str]:
        return sorted({f.project for f in self.files})

    def missing_upload_times(self) -> list[str]:
        """Files with no upload time (a date cap cannot be applied to them)."""
        return [f.filename for f in self.files if f.upload_time is None]

    def _project_files(self, project: str) -> list[IndexFile]:
        return [f for f in self.files if f.project == project]

    def root_json(self) -> dict[str, Any]:
        return {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in self.projects]}

    def project_json(self, project: str) -> dict[str, Any]:
        files = []
        for f in self._project_files(project):
            entry: dict[str, Any] = {"filename": f.filename, "url": f"../../files/{quote(f.filename)}",
                                     "hashes": {"sha256": f.sha256}, "size": f.size}
            if f.upload_time is not None:
                entry["upload-time"] = format_time(f.upload_time)
            files.append(entry)
        versions = sorted({f.version for f in self._project_files(project)})
        return {"meta": {"api-version": API_VERSION}, "name": project, "files": files, "versions": versions}

    def root_html(self) -> str:
        links = "\n".join(f'<a href="{quote(p)}/">{html.escape(p)}</a><br/>' for p in self.projects)
        return (f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="{API_VERSION}">'
                f"<title>Simple index</title></head><body>\n{links}\n</body></html>\n")

    def project_html(self, project: str) -> str:
        links = "\n".join(
            f'<a href="../../files/{quote(f.filename)}#sha256={f.sha256}">{html.escape(f.filename)}</a><br/>'
            for f in self._project_files(project))
        return (f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="{API_VERSION}">'
                f"<title>Links for {html.escape(project)}</title></head><body>\n<h1>Links for "
                f"{html.escape(project)}</h1>\n{links}\n</body></html>\n")

    # ---- server
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the index is not running (use start() or a with block)")
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    def start(self) -> str:
        """Start serving (idempotent); returns :attr:`url`."""
        if self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
            self._server.daemon_threads = True
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name="lmforge-index", daemon=True)
            self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LocalIndex:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(index: LocalIndex) -> type[BaseHTTPRequestHandler]:
    by_name = {f.filename: f for f in index.files}

    class Handler(BaseHTTPRequestHandler):
        server_version = "lmforge-index"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            index.requests += 1
            parts = urlsplit(self.path)
            path = parts.path
            fmt_q = parse_qs(parts.query).get("format", [None])[0]
            if fmt_q is not None and "json" in fmt_q.lower():
                # ``?format=json``, or the PEP 691 media type whose "+" the query decoding made a space
                fmt_q = "application/vnd.pypi.simple.v1+json"
            fmt = choose_format(fmt_q or self.headers.get("Accept"))
            if not index.serve_json:
                fmt = "html"
            if path.startswith("/files/"):
                f = by_name.get(unquote(path[len("/files/"):]))
                if f is None:
                    self._send(404, b"not found\n", "text/plain")
                    return
                self._send(200, f.path.read_bytes(), "application/octet-stream")
                return
            if path in ("/simple", "/simple/"):
                if fmt == "json":
                    self._send(200, json.dumps(index.root_json()).encode(), JSON_TYPE)
                else:
                    self._send(200, index.root_html().encode(), "text/html; charset=utf-8")
                return
            m = re.fullmatch(r"/simple/([^/]+)/?", path)
            if m:
                name = m.group(1)
                project = normalize(name)
                if project not in index.projects:
                    self._send(404, b"not found\n", "text/plain")
                    return
                if name != project or not path.endswith("/"):
                    self._send(301, b"", "text/plain", {"Location": f"/simple/{project}/"})
                    return
                if fmt == "json":
                    self._send(200, json.dumps(index.project_json(project)).encode(), JSON_TYPE)
                else:
                    self._send(200, index.project_html(project).encode(), "text/html; charset=utf-8")
                return
            self._send(404, b"not found\n", "text/plain")

    return Handler


def serve(folder: str, upload_times: str | None = None) -> LocalIndex:
    """Start a :class:`LocalIndex` of ``folder`` and return it (``url``, ``stop()``): the
    :class:`lmforge.common.command_sandbox.Service` target that runs the index inside a sandbox's
    private network namespace."""
    index = LocalIndex(folder, upload_times)
    index.start()
    return index
