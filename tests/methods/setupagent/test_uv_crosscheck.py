"""Cross-check of the date-capped resolution against uv: the issue's "date-capped resolution equals
``uv pip compile --exclude-newer`` on the same index".

lmforge caps an instance's dependencies at its ``created_at`` (SetUpAgent, ICML 2025) with pip's
``--uploaded-prior-to``, which reads the PEP 700 ``upload-time`` that :class:`LocalIndex` serves.
Here a small dependency graph, several versions uploaded at different dates, is resolved at
several caps by

1. pip: ``pip install --dry-run --ignore-installed --report ... --uploaded-prior-to CAP``, pins
   from the report's ``install`` items, and
2. uv: ``uv pip compile - --exclude-newer CAP``, pins from its ``name==version`` lines,

both against the same loopback index. The two pin sets must be equal at every cap, and each must
equal the pins written by hand from the upload table below (an oracle independent of both tools,
so a bug shared by pip, uv and the index would still fail). The cap changes the answer non-trivially:
a new ``beta`` pulls in a new project (``gamma``) and raises ``alpha``'s floor, ``gamma`` 0.9 needs
``alpha>=2``, ``alpha<3`` masks the newest ``alpha``, and the newest ``gamma`` needs a newer Python.

Boundary semantics measured (pip 26.3, uv 0.13.9, this index):

* Both caps are EXCLUSIVE: a file uploaded exactly at the cap is not a candidate ("uploaded prior
  to" / "uploaded before"); one second later it is.
* A cap with an explicit offset (``...+02:00``) is converted to UTC by both tools.
* Where they differ (only for caps lmforge does not write; ``created_at`` is whole seconds in UTC,
  ``...Z``), measured with ``TZ=UTC0``:
  - sub-millisecond caps: pip compares at microsecond precision; uv truncates the cap to
    milliseconds (a file uploaded at ``12:00:00Z`` is excluded by a cap of ``12:00:00.000500Z``);
  - a date without a time (``2022-06-15``): pip reads local midnight at the START of that day, uv
    the END of that day (the next local midnight);
  - a datetime without an offset: pip reads it in the local time zone; uv drops the time of day and
    treats it as the local date, i.e. the next local midnight.
  Both tools take the local zone from ``TZ``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest

from lmforge.methods.setupagent.index import LocalIndex, build_wheel, normalize

if int(dist_version("pip").split(".")[0]) < 26:
    pytest.skip("pip < 26 has no --uploaded-prior-to", allow_module_level=True)
try:
    import uv
except ImportError:
    pytest.skip("the reference package uv is not installed (make install: uv==0.13.9)", allow_module_level=True)
try:
    UV = uv.find_uv_bin()
except FileNotFoundError:
    pytest.skip("the uv package is installed but its uv binary is not found", allow_module_level=True)

PY = f"{sys.version_info.major}.{sys.version_info.minor}"  # pip resolves for this interpreter; uv is told the same
NEWER_PY = f">={sys.version_info.major}.{sys.version_info.minor + 1}"

# (project, version, Requires-Dist, Requires-Python, upload time)
UPLOADS = [
    ("alpha", "1.0", (), None, "2021-03-01T00:00:00Z"),
    ("beta", "1.0", ("alpha>=1.0",), None, "2021-05-01T00:00:00Z"),
    ("gamma", "0.5", (), None, "2022-02-01T00:00:00Z"),
    ("alpha", "1.1", (), None, "2022-06-15T12:00:00Z"),
    ("beta", "2.0", ("alpha>=1.1", "gamma"), None, "2023-06-01T00:00:00Z"),
    ("alpha", "2.0", (), None, "2024-01-10T00:00:00Z"),
    ("gamma", "0.9", ("alpha>=2",), None, "2024-02-20T00:00:00Z"),
    ("gamma", "1.0", (), NEWER_PY, "2024-03-15T00:00:00Z"),  # never installable on this Python
    ("alpha", "3.0", (), None, "2025-03-01T00:00:00Z"),  # masked by the top-level alpha<3
]
REQUIREMENTS = ["beta", "alpha<3"]

# The oracle, by hand from UPLOADS: the newest beta uploaded strictly before the cap, then the newest
# alpha (< 3) and gamma that satisfy it and each other.
CASES = [
    # only the first uploads exist
    ("2021-06-01T00:00:00Z", {"alpha": "1.0", "beta": "1.0"}),
    # exactly alpha 1.1's upload time: exclusive in both tools, so alpha stays 1.0
    ("2022-06-15T12:00:00Z", {"alpha": "1.0", "beta": "1.0"}),
    # one second later alpha 1.1 is a candidate
    ("2022-06-15T12:00:01Z", {"alpha": "1.1", "beta": "1.0"}),
    # offsets are converted to UTC: 13:00+02:00 is 11:00Z (before alpha 1.1), 14:00:01+02:00 after it
    ("2022-06-15T13:00:00+02:00", {"alpha": "1.0", "beta": "1.0"}),
    ("2022-06-15T14:00:01+02:00", {"alpha": "1.1", "beta": "1.0"}),
    # exactly beta 2.0's upload time: exclusive, so still beta 1.0 and no gamma at all
    ("2023-06-01T00:00:00Z", {"alpha": "1.1", "beta": "1.0"}),
    # beta 2.0 brings gamma and alpha>=1.1
    ("2023-07-01T00:00:00Z", {"alpha": "1.1", "beta": "2.0", "gamma": "0.5"}),
    ("2024-01-15T00:00:00Z", {"alpha": "2.0", "beta": "2.0", "gamma": "0.5"}),
    # gamma 0.9 (needs alpha>=2)
    ("2024-03-01T00:00:00Z", {"alpha": "2.0", "beta": "2.0", "gamma": "0.9"}),
    # everything uploaded: alpha 3.0 is masked by alpha<3, gamma 1.0 by its Requires-Python
    ("2026-01-01T00:00:00Z", {"alpha": "2.0", "beta": "2.0", "gamma": "0.9"}),
]
BEFORE_ANY_BETA = "2021-04-01T00:00:00Z"  # alpha 1.0 exists, no beta yet


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("uv-crosscheck-wheels")
    times = {}
    for name, ver, requires, requires_python, when in UPLOADS:
        path = build_wheel(name, ver, {f"{name}/__init__.py": f"VERSION = {ver!r}\n"}, folder,
                           requires=requires, requires_python=requires_python)
        times[path.name] = when
    (folder / "upload-times.json").write_text(json.dumps(times))
    with LocalIndex(folder) as idx:
        yield idx


def _env() -> dict[str, str]:
    # no user/site configuration of either tool (PIP_FIND_LINKS, UV_INDEX_URL, UV_EXCLUDE_NEWER, ...),
    # no proxy for the loopback index, and a fixed local zone for caps without an offset
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("PIP_", "UV_")) and "proxy" not in k.lower()}
    env.update({"PIP_CONFIG_FILE": os.devnull, "UV_PYTHON_DOWNLOADS": "never", "TZ": "UTC0"})
    return env


def _pip(index: LocalIndex, cap: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    report = tmp_path / f"pip-report-{len(list(tmp_path.iterdir()))}.json"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report", str(report),
         "--index-url", index.url, "--uploaded-prior-to", cap, "--no-cache-dir", "--quiet",
         "--disable-pip-version-check", *REQUIREMENTS],
        capture_output=True, text=True, env=_env(), timeout=120)
    pins = {}
    if res.returncode == 0:
        for item in json.loads(report.read_text())["install"]:
            pins[normalize(item["metadata"]["name"])] = item["metadata"]["version"]
    return res, pins


def _uv(index: LocalIndex, cap: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    res = subprocess.run(
        [UV, "pip", "compile", "-", "--index-url", index.url, "--exclude-newer", cap, "--no-cache", "--no-config",
         "--python", sys.executable, "--python-version", PY, "--no-header", "--no-annotate", "--quiet"],
        input="\n".join(REQUIREMENTS) + "\n", capture_output=True, text=True, env=_env(), timeout=120)
    pins = {}
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*", line)
            if m:
                pins[normalize(m.group(1))] = m.group(2)
    return res, pins


@pytest.mark.parametrize(("cap", "expected"), CASES, ids=[c for c, _ in CASES])
def test_pip_and_uv_resolve_the_same_pins_as_the_upload_table(index: LocalIndex, tmp_path: Path, cap: str,
                                                             expected: dict[str, str]):
    pip_res, pip_pins = _pip(index, cap, tmp_path)
    assert pip_res.returncode == 0, pip_res.stderr
    uv_res, uv_pins = _uv(index, cap)
    assert uv_res.returncode == 0, uv_res.stderr
    assert pip_pins == uv_pins, f"pip and uv disagree at {cap}"
    assert pip_pins == expected, f"both tools disagree with the upload table at {cap}"


def test_both_fail_when_the_cap_precedes_every_beta(index: LocalIndex, tmp_path: Path):
    pip_res, _ = _pip(index, BEFORE_ANY_BETA, tmp_path)
    assert pip_res.returncode != 0
    assert "beta" in pip_res.stderr
    uv_res, _ = _uv(index, BEFORE_ANY_BETA)
    assert uv_res.returncode != 0
    assert "beta" in uv_res.stderr and "exclude-newer" in uv_res.stderr


# Where the tools part ways: caps that are not whole seconds with an offset (see the module
# docstring). Measured with TZ=UTC0 on pip 26.3 and uv 0.13.9; alpha 1.1 was uploaded 2022-06-15T12:00:00Z.
DIVERGENT = [
    # pip: microsecond precision, 12:00:00.0005 is after the upload; uv: the cap truncated to 12:00:00.000
    ("2022-06-15T12:00:00.000500Z", "1.0", "1.1", "1.0"),
    # a date: pip reads 2022-06-15T00:00 local (before), uv 2022-06-16T00:00 local (after)
    ("2022-06-15", "1.0", "1.0", "1.1"),
    # no offset: pip reads 11:30 local = 11:30Z (before); uv drops the time, next local midnight (after)
    ("2022-06-15T11:30:00", "1.0", "1.0", "1.1"),
]


@pytest.mark.parametrize(("cap", "beta", "pip_alpha", "uv_alpha"), DIVERGENT, ids=[d[0] for d in DIVERGENT])
def test_measured_differences_for_caps_lmforge_does_not_write(index: LocalIndex, tmp_path: Path, cap: str,
                                                              beta: str, pip_alpha: str, uv_alpha: str):
    if dist_version("uv") != "0.13.9":
        pytest.skip(f"measured on uv 0.13.9, installed {dist_version('uv')}")
    pip_res, pip_pins = _pip(index, cap, tmp_path)
    assert pip_res.returncode == 0, pip_res.stderr
    uv_res, uv_pins = _uv(index, cap)
    assert uv_res.returncode == 0, uv_res.stderr
    assert pip_pins == {"alpha": pip_alpha, "beta": beta}
    assert uv_pins == {"alpha": uv_alpha, "beta": beta}
