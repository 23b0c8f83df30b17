"""docs/development.md's Layout names every module of the package, and no module that is gone.

The Layout is where a reader finds which module does what: a module it leaves out has to be
found by grepping, and one it names after a rename or a removal sends them looking for nothing.
So every ``*.py`` under ``tools/llamanix`` (``__init__`` and ``__main__`` aside) is named in the
Layout's ``text`` block by its stem as a word of its own, every package folder as ``NAME/``, and
every snake_case word in parentheses there is the stem of a module that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tools" / "llamanix"
DOC = ROOT / "docs" / "development.md"


def layout_block() -> str:
    """The first ```text block after the "## Layout" heading."""
    after = DOC.read_text().split("\n## Layout\n", 1)[1]
    found = re.search(r"^```text\n(.*?)^```$", after, re.DOTALL | re.MULTILINE)
    assert found, f"{DOC}: no ```text block after '## Layout'"
    return found.group(1)


def module_stems() -> dict[str, list[str]]:
    """Each folder of the package, relative to it, and the stems of its modules."""
    stems: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            stems.setdefault(path.parent.relative_to(PACKAGE).as_posix(), []).append(path.stem)
    return stems


def named(word: str, block: str) -> bool:
    """``word`` stands alone in ``block``: not in a program's name (``nvidia-smi``) or a path."""
    return re.search(rf"(?<![\w./-]){re.escape(word)}(?![\w/-])", block) is not None


def test_layout_names_every_module_and_package() -> None:
    block = layout_block()
    missing = [
        f"{folder}/: {', '.join(absent)} (add to the {folder.rsplit('/', 1)[-1]}/ entry of "
        f"the Layout, {DOC.relative_to(ROOT)})"
        for folder, stems in module_stems().items()
        if (absent := [stem for stem in stems if not named(stem, block)])
    ]
    missing += [
        f"{init.parent.relative_to(PACKAGE.parent)}/: the package folder is not named as "
        f"{init.parent.name}/ in the Layout, {DOC.relative_to(ROOT)}"
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if not re.search(rf"(?<![\w-]){init.parent.name}/", block)
    ]
    assert not missing, "modules the Layout does not name:\n" + "\n".join(missing)


def test_layout_names_no_module_that_is_gone() -> None:
    stems = {stem for folder in module_stems().values() for stem in folder}
    in_parentheses = " ".join(re.findall(r"\(([^()]*)\)", layout_block()))
    gone = set(re.findall(r"(?<![\w./-])[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]\b", in_parentheses))
    assert not gone - stems, f"the Layout names modules that do not exist: {sorted(gone - stems)}"
