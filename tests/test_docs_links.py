"""Every relative link in README.md and docs/ leads somewhere: the file exists, and a #section exists in it.

Links are Markdown's [text](target); code blocks are skipped. A section anchor is checked the way
GitHub makes one from a heading (lower case, punctuation dropped, spaces to hyphens, a repeated
heading gets -1, -2, ...), so a renamed heading breaks the test, not the reader's click.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The page without code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The section anchors GitHub gives the headings of ``page``."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not ours to check


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, leads nowhere; None when it resolves."""
    path, _, anchor = target.partition("#")
    destination = (page.parent / path).resolve() if path else page
    if not destination.exists():
        return f"{shown(destination)} does not exist"
    if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
        return f"no section #{anchor} in {shown(destination)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_of_the_page_resolves(page):
    problems = [f"[...]({target}): {why}" for target in relative_links(page) if (why := broken(page, target))]
    assert problems == [], f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_checker_finds_links_files_and_sections(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Why, next to X\n\n## Why, next to X\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#why-next-to-x) [dup](a.md#why-next-to-x-1) [web](https://x.org/y) "
                    "`[code](nowhere.md)`\n```\n[block](nowhere.md)\n```\n[gone](c.md) [bad](a.md#nope)\n")
    assert relative_links(page) == ["a.md#why-next-to-x", "a.md#why-next-to-x-1", "c.md", "a.md#nope"]
    assert [broken(page, target) is None for target in relative_links(page)] == [True, True, False, False]
