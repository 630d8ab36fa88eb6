"""Every relative link in README.md and docs/*.md resolves: the file exists, and an anchor names a heading in it.

Links are read outside fenced code blocks and inline code, as GitHub renders them; anchors are GitHub's heading
slugs. Web links (``http:``, ``https:``, ``mailto:``) are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str, *, drop_code: bool = True) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1; inline code removed unless ``drop_code`` is false."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, _INLINE_CODE.sub("", line) if drop_code else line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8"), drop_code=False):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    """One line per link of ``page`` that does not resolve, saying where it is and why."""
    problems = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if _SCHEME.match(target):
                continue
            where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{number}: {target}"
            path_part, _, anchor = target.partition("#")
            if path_part.startswith("/"):
                problems.append(f"{where}: absolute path; link relative to the page")
                continue
            file = (page.parent / path_part).resolve() if path_part else page
            if not file.exists():
                shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
                problems.append(f"{where}: no such file {shown}")
                continue
            if anchor:
                if file.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(file):
                    problems.append(f"{where}: no heading with anchor #{anchor} in {file.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_docs_exist() -> None:
    assert (ROOT / "docs").is_dir() and len(PAGES) > 1, "README.md links docs/*.md; docs/ holds no Markdown page"


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing anchor and a missing in-page anchor are each reported; links
    in code, web links and good anchors are not."""
    other = "# Other page\n\n## A `code` heading, with punctuation!\n\n## Twice\n\n## Twice\n"
    (tmp_path / "other.md").write_text(other, encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [ok](other.md#twice-1) [ok](#page)\n"
        "[web](https://example.com/x#y) `[in code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[bad file](missing.md)\n"
        "[bad anchor](other.md#nope)\n"
        "![bad image](img/none.png)\n"
        "[bad here](#nowhere)\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert [p.split(": ")[1] for p in problems] == ["missing.md", "other.md#nope", "img/none.png", "#nowhere"]
