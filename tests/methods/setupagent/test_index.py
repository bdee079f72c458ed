"""The date-capped local index: its JSON and HTML pages against the files' bytes, and the real pip
choosing toydep 1.x under ``--uploaded-prior-to`` but 2.0 without it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.setupagent.index import JSON_TYPE, LocalIndex, build_wheel, choose_format, scan_folder

TIMES = {"1.0": "2023-01-10T00:00:00Z", "1.1": "2023-03-01T12:30:00Z", "2.0": "2024-02-01T00:00:00Z"}
CAP = "2023-06-01T00:00:00Z"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    times = {}
    for version, when in TIMES.items():
        path = build_wheel("toydep", version, {"toydep/__init__.py": f"VERSION = {version!r}\n"}, folder)
        times[path.name] = when
    (folder / "upload-times.json").write_text(json.dumps(times))
    return folder


@pytest.fixture
def index(wheels: Path):
    idx = LocalIndex(wheels)
    idx.start()
    try:
        yield idx
    finally:
        idx.stop()


@pytest.fixture
def html_only_index(wheels: Path):
    idx = LocalIndex(wheels, serve_json=False)
    idx.start()
    try:
        yield idx
    finally:
        idx.stop()


def _get(url: str, accept: str | None = None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def _pip_has_upload_cap() -> bool:
    from importlib.metadata import version

    return int(version("pip").split(".")[0]) >= 26  # --uploaded-prior-to came with pip 26


needs_pip26 = pytest.mark.skipif(not _pip_has_upload_cap(), reason="pip < 26 has no --uploaded-prior-to")


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_") and "proxy" not in k.lower()}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", *args, "--no-cache-dir", "--disable-pip-version-check"],
                          capture_output=True, text=True, env=env, timeout=120)


def test_build_wheel_is_a_valid_wheel(wheels: Path):
    path = wheels / "toydep-1.1-py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        assert names == {"toydep/__init__.py", "toydep-1.1.dist-info/METADATA", "toydep-1.1.dist-info/WHEEL",
                         "toydep-1.1.dist-info/RECORD"}
        meta = zf.read("toydep-1.1.dist-info/METADATA").decode()
        assert "Name: toydep\nVersion: 1.1\n" in meta
        rows = [line.split(",") for line in zf.read("toydep-1.1.dist-info/RECORD").decode().splitlines()]
        init = next(r for r in rows if r[0] == "toydep/__init__.py")
        data = zf.read("toydep/__init__.py")
        assert int(init[2]) == len(data)
        assert init[1] == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    # deterministic: the same inputs give the same bytes
    again = build_wheel("toydep", "1.1", {"toydep/__init__.py": "VERSION = '1.1'\n"}, wheels.parent / "again")
    assert again.read_bytes() == path.read_bytes()


def test_json_page_has_hashes_of_the_bytes_and_upload_times(index: LocalIndex, wheels: Path):
    ctype, body = _get(index.url + "toydep/", accept=f"{JSON_TYPE}, text/html; q=0.01")
    assert ctype == JSON_TYPE
    page = json.loads(body)
    assert page["meta"]["api-version"] == "1.1"
    assert page["versions"] == ["1.0", "1.1", "2.0"]
    by_name = {f["filename"]: f for f in page["files"]}
    assert set(by_name) == {f"toydep-{v}-py3-none-any.whl" for v in TIMES}
    for version, when in TIMES.items():
        entry = by_name[f"toydep-{version}-py3-none-any.whl"]
        data = (wheels / entry["filename"]).read_bytes()
        assert entry["hashes"]["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["size"] == len(data)
        assert entry["upload-time"] == when
        # the file URL, resolved against the page, serves those bytes
        _, served = _get(urllib.request.urljoin(index.url + "toydep/", entry["url"]))
        assert served == data
    _, root = _get(index.url, accept=JSON_TYPE)
    assert json.loads(root)["projects"] == [{"name": "toydep"}]


def test_html_page_when_json_not_asked(index: LocalIndex, wheels: Path):
    ctype, body = _get(index.url + "toydep/")
    assert ctype.startswith("text/html")
    text = body.decode()
    links = re.findall(r'href="([^"]+)#sha256=([0-9a-f]{64})"', text)
    assert len(links) == 3
    for href, digest in links:
        name = href.rsplit("/", 1)[1]
        assert digest == hashlib.sha256((wheels / name).read_bytes()).hexdigest()
    assert "upload-time" not in text  # PEP 700: the HTML API has no upload times


def test_format_negotiation_and_names():
    assert choose_format(None) == "html"
    assert choose_format("text/html") == "html"
    assert choose_format(f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01") == "json"
    assert choose_format(f"text/html, {JSON_TYPE}; q=0.5") == "html"


def test_unnormalized_name_redirects_and_unknown_is_404(index: LocalIndex):
    ctype, body = _get(index.url + "ToyDep/", accept=JSON_TYPE)  # urllib follows the redirect
    assert json.loads(body)["name"] == "toydep"
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(index.url + "nothere/")
    assert err.value.code == 404
    with pytest.raises(urllib.error.HTTPError):
        _get(index.url.replace("/simple/", "/files/") + "..%2Fupload-times.json")


def test_bad_upload_times_are_user_errors(tmp_path: Path):
    build_wheel("toydep", "1.0", {"toydep/__init__.py": ""}, tmp_path)
    with pytest.raises(UserError, match="not in"):
        scan_folder(tmp_path, {"other-1.0-py3-none-any.whl": "2023-01-01T00:00:00Z"})
    with pytest.raises(UserError, match="time zone"):
        scan_folder(tmp_path, {"toydep-1.0-py3-none-any.whl": "2023-01-01T00:00:00"})
    assert LocalIndex(tmp_path).missing_upload_times() == ["toydep-1.0-py3-none-any.whl"]


@needs_pip26
def test_pip_download_respects_the_date_cap(index: LocalIndex, tmp_path: Path):
    capped = _pip("download", "--no-deps", "--index-url", index.url, "--uploaded-prior-to", CAP, "toydep",
                  "-d", str(tmp_path / "capped"))
    assert capped.returncode == 0, capped.stderr
    assert os.listdir(tmp_path / "capped") == ["toydep-1.1-py3-none-any.whl"]
    free = _pip("download", "--no-deps", "--index-url", index.url, "toydep", "-d", str(tmp_path / "free"))
    assert free.returncode == 0, free.stderr
    assert os.listdir(tmp_path / "free") == ["toydep-2.0-py3-none-any.whl"]


@needs_pip26
def test_pip_install_target_with_the_cap(index: LocalIndex, tmp_path: Path):
    target = tmp_path / "site"
    res = _pip("install", "--no-deps", "--index-url", index.url, "--uploaded-prior-to", CAP, "--target", str(target),
               "toydep")
    assert res.returncode == 0, res.stderr
    assert (target / "toydep" / "__init__.py").read_text() == "VERSION = '1.1'\n"
    assert (target / "toydep-1.1.dist-info").is_dir()


@needs_pip26
def test_pip_refuses_a_cap_on_an_index_without_upload_times(html_only_index: LocalIndex, tmp_path: Path):
    res = _pip("download", "--no-deps", "--index-url", html_only_index.url, "--uploaded-prior-to", CAP, "toydep",
               "-d", str(tmp_path / "dl"))
    assert res.returncode != 0
    assert "upload-time" in res.stderr
    assert not (tmp_path / "dl").exists() or not os.listdir(tmp_path / "dl")


def test_stop_closes_the_server(wheels: Path):
    with LocalIndex(wheels) as idx:
        url = idx.url
        _get(url)
    assert idx.requests == 1
    with pytest.raises(urllib.error.URLError):
        _get(url)


def test_local_version_files_download_and_format_query_selects_json(tmp_path: Path):
    """A file name with '+' (a local version) is linked percent-encoded and must be served under that
    link; ``?format=json`` and the PEP 691 media type in the query select JSON."""
    path = build_wheel("toydep", "1.0+cpu", {"toydep/__init__.py": ""}, tmp_path)
    (tmp_path / "upload-times.json").write_text(json.dumps({path.name: "2023-01-01T00:00:00Z"}))
    with LocalIndex(tmp_path) as idx:
        ctype, body = _get(idx.url + "toydep/?format=json")
        assert ctype.startswith(JSON_TYPE)
        (entry,) = json.loads(body)["files"]
        assert "%2B" in entry["url"] or "+" in entry["url"]
        _, data = _get(urllib.parse.urljoin(idx.url + "toydep/", entry["url"]))
        assert hashlib.sha256(data).hexdigest() == entry["hashes"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        ctype, _ = _get(idx.url + "toydep/?format=application/vnd.pypi.simple.v1+json")
        assert ctype.startswith(JSON_TYPE)


# ------------------------------------------------------------------- wheel_from_installed, serve


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_wheel_from_installed_repacks_the_installed_files(tmp_path: Path):
    import csv
    import io
    from importlib import metadata

    from lmforge.methods.setupagent.index import wheel_from_installed

    dist = metadata.distribution("iniconfig")
    path = wheel_from_installed("iniconfig", tmp_path / "wheels")
    assert path.name == f"iniconfig-{dist.version}-py3-none-any.whl"
    info = f"iniconfig-{dist.version}.dist-info"
    # what should be in it, read here from the install: every file of its RECORD inside the install
    # root, without byte code and without what an installer writes (INSTALLER, REQUESTED, direct_url.json)
    expected: dict[str, bytes] = {}
    for item in dist.files or []:
        parts = item.parts
        if parts[0] == ".." or "__pycache__" in parts or item.suffix == ".pyc":
            continue
        if parts[0] == info and len(parts) == 2 and parts[1] in ("RECORD", "INSTALLER", "REQUESTED",
                                                                 "direct_url.json"):
            continue
        expected[item.as_posix()] = Path(item.locate()).read_bytes()
    assert "iniconfig/__init__.py" in expected and f"{info}/METADATA" in expected
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
        contents = {name: zf.read(name) for name in zf.namelist()}
    record_text = contents.pop(f"{info}/RECORD").decode()
    assert contents == expected  # byte for byte, nothing more and nothing less
    rows = list(csv.reader(io.StringIO(record_text)))
    assert sorted(r[0] for r in rows) == sorted([*contents, f"{info}/RECORD"])  # each file listed once
    for name, digest, size in rows:
        if name == f"{info}/RECORD":
            assert digest == size == ""
            continue
        assert digest == _record_hash(contents[name]), name
        assert int(size) == len(contents[name])
    # pip installs it offline, and what it installed imports (from the target, not this environment)
    target = tmp_path / "site"
    res = _pip("install", "--no-index", "--no-deps", "--target", str(target), str(path))
    assert res.returncode == 0, res.stderr
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import iniconfig; "
             "from importlib.metadata import version; "
             "print(iniconfig.__file__); print(version('iniconfig')); "
             "print(iniconfig.IniConfig('x.ini', data='[s]\\nk = v\\n')['s']['k'])")
    out = subprocess.run([sys.executable, "-I", "-c", probe, str(target)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    file, version, value = out.stdout.split()
    assert Path(file).resolve() == (target / "iniconfig" / "__init__.py").resolve()
    assert version == dist.version and value == "v"
    assert (target / info / "RECORD").is_file() and (target / info / "INSTALLER").read_text().strip() == "pip"
    # deterministic: a second re-pack is the same bytes
    assert wheel_from_installed("iniconfig", tmp_path / "again").read_bytes() == path.read_bytes()


def test_wheel_from_installed_refuses_unknown_and_non_pure(tmp_path: Path):
    from importlib import metadata

    from lmforge.methods.setupagent.index import wheel_from_installed

    with pytest.raises(UserError, match="not installed"):
        wheel_from_installed("no-such-distribution-lmforge", tmp_path)
    platlib = next((d.metadata["Name"] for d in metadata.distributions()
                    if "Root-Is-Purelib: false" in (d.read_text("WHEEL") or "")), None)
    if platlib is not None:
        with pytest.raises(UserError, match="not a pure-Python wheel"):
            wheel_from_installed(platlib, tmp_path)
    assert not any(tmp_path.iterdir())


def test_serve_returns_a_started_index_that_stops(wheels: Path):
    from lmforge.methods.setupagent.index import serve

    idx = serve(str(wheels), str(wheels / "upload-times.json"))
    try:
        assert isinstance(idx, LocalIndex)
        url = idx.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/simple/")
        ctype, body = _get(url)
        assert ctype.startswith("text/html") and 'href="toydep/"' in body.decode()
        _, page = _get(idx.url + "toydep/", accept=JSON_TYPE)
        assert {f["upload-time"] for f in json.loads(page)["files"]} == set(TIMES.values())
    finally:
        idx.stop()
    with pytest.raises(urllib.error.URLError):
        _get(url)
    with pytest.raises(RuntimeError, match="not running"):
        idx.url
