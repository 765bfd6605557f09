"""The README and the guides in docs/: every relative link resolves to a file of the
repository (and a #section to a heading in it), and no text cites an issue number."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w/])#\d+\b|\bpoint \d+ of", re.IGNORECASE)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_file() or root not in file.parents:
            bad.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves_to_a_file_of_the_repository(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_text_cites_an_issue_number(page):
    assert ISSUE.findall(page.read_text()) == []


def test_the_checks_fail_on_their_mistakes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[a](missing.md) [b](#nowhere) [c](#top) [d](https://x.org)\n")
    assert broken_links(page, tmp_path) == ["missing.md", "#nowhere"]
    assert ISSUE.findall("as issue 12 asks; see #27") == ["issue 12", "#27"]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
