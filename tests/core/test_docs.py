"""What users read: every relative link of the README and docs/ leads to a file of the tree, the
README stays short, and neither speaks of how the project was built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == [], f"{page.name}: links to nothing: {broken}"


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().split()) <= 1200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_development_history(page: Path) -> None:
    said = re.findall(r"(?i)\bsession \d+|device (?:time|minutes)|\bissue #?\d+|\bround r\d+", page.read_text())
    assert said == [], f"{page.name}: {said}"
