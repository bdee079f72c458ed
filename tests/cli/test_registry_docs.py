"""Registry, README table and PAPERS.md agree (DESIGN.md convention 5)."""

from __future__ import annotations

import re
from pathlib import Path

from lmforge.registry import FAMILIES, load_all

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_matches_registry():
    reg = load_all()
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \| (.+?) \| `src/lmforge/methods/\1/` \| .+? \| (\w+) \|$",
                      (ROOT / "README.md").read_text(), flags=re.M)
    assert {r[0] for r in rows} == set(reg)
    for name, family, paper, status in rows:
        assert reg[name].family == family and reg[name].paper == paper and reg[name].status == status


def test_papers_md_lists_every_method():
    text = (ROOT / "PAPERS.md").read_text()
    assert set(re.findall(r"^## `([a-z0-9_]+)`", text, flags=re.M)) == set(load_all())


def test_every_method_folder_registers_itself_with_a_known_family():
    reg = load_all()
    folders = {p.name for p in (ROOT / "src/lmforge/methods").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(reg)
    assert all(m.family in FAMILIES for m in reg.values())
    # A method may only claim "works"/"implemented" once it has an entry point.
    assert all(m.entry is not None for m in reg.values() if m.status != "planned")
