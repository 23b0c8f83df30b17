"""Every relative link and #anchor in README.md and docs/ resolves (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        m = re.match(r"#{1,6} (.+)", line)
        if fence or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(prose(path.read_text()))]


def test_slugs_follow_github() -> None:
    assert slug("Quick start 3: the demo, no GPU needed") == "quick-start-3-the-demo-no-gpu-needed"
    assert (
        slug("`llamanix bench compare A.json B.json [...]`")
        == "llamanix-bench-compare-ajson-bjson-"
    )
    assert slug("Your nixpkgs or ours") == "your-nixpkgs-or-ours"


def test_the_docs_are_linked_from_the_readme() -> None:
    targets = {t.split("#")[0] for t in links(ROOT / "README.md")}
    for doc in (ROOT / "docs").glob("*.md"):
        assert f"docs/{doc.name}" in targets, f"README.md does not link {doc.name}"


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    for target in links(doc):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        assert path.exists(), f"{doc.relative_to(ROOT)}: {target}: no such file"
        if anchor:
            assert path.suffix == ".md", (
                f"{doc.relative_to(ROOT)}: {target}: anchor into non-markdown"
            )
            assert anchor in anchors(path), f"{doc.relative_to(ROOT)}: {target}: no such heading"
