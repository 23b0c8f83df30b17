"""CI installs every program the tests run: each program the code or a test runs or looks up is
installed by .ci/run, comes with every Debian, or has a stand-in in the tests, with its reason.

The programs are read from the code, not listed by hand: every ``shutil.which(...)`` in
tools/ and tests/ (a literal, a module's constant, an element of a constant tuple, or the loop
variable over a literal table), every argv the external layer builds (a list or tuple whose first
word is a program: tools/llamanix/external/ is the one place programs are run), and every
``subprocess`` call of a test. A fresh machine once lacked ``nft``, and the handover test
errored: a program added to the code without a line in .ci/run fails here instead.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tools" / "llamanix"
PROGRAM = re.compile(r"^[a-z][a-z0-9._+-]*$")

# Programs of Debian's Essential packages: on every Debian machine, never installed by anyone.
ESSENTIAL = {
    "bash": "bash",
    "sh": "dash",
    "env": "coreutils",
    "sleep": "coreutils",
    "true": "coreutils",
    "nsenter": "util-linux",
    "setpriv": "util-linux",
    "unshare": "util-linux",
}

# Programs no CI machine has, and why none is needed: the tests that run them give a recording
# stand-in (tests/standins.py), or the program is this checkout's own.
NOT_INSTALLED = {
    "nixos-rebuild": "NixOS only: a stand-in records its argv",
    "nvidia-smi": "an NVIDIA driver's: a stand-in prints recorded output",
    "cuobjdump": "the CUDA toolkit's: a stand-in prints recorded output",
    "llamanix": "this checkout's console script, installed by .ci/run's pip install -e",
}


def _python_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Constants:
    """Module-level string and tuple-of-string constants of the package, by module, and what
    each file's imports name them."""

    def __init__(self) -> None:
        self.by_module: dict[str, dict[str, object]] = {}
        for path in _python_files(PACKAGE):
            found: dict[str, object] = {}
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    value = _literal(node.value) if node.value is not None else None
                    for target in targets:
                        if isinstance(target, ast.Name) and value is not None:
                            found[target.id] = value
            self.by_module[_module(path)] = found

    def scope(self, path: Path, tree: ast.Module) -> _Scope:
        """The names a file can use: its own constants, and those and the modules it imports."""
        own = self.by_module.get(_module(path), {}) if path.is_relative_to(PACKAGE) else {}
        names: dict[str, object] = dict(own)
        modules: dict[str, dict[str, object]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    sub = f"{node.module}.{alias.name}"
                    if sub in self.by_module:
                        modules[local] = self.by_module[sub]
                    elif alias.name in self.by_module.get(node.module, {}):
                        names[local] = self.by_module[node.module][alias.name]
        return _Scope(names, modules)


class _Scope:
    def __init__(self, names: dict[str, object], modules: dict[str, dict[str, object]]) -> None:
        self.names = names
        self.modules = modules

    def resolve(self, node: ast.expr) -> object:
        """The value of a constant expression, or None when it is none."""
        literal = _literal(node)
        if literal is not None:
            return literal
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.modules.get(node.value.id, {}).get(node.attr)
        if isinstance(node, ast.Subscript):
            whole = self.resolve(node.value)
            index = _literal(node.slice)
            if isinstance(whole, tuple) and isinstance(index, int):
                return whole[index]
        return None


def _literal(node: ast.expr | None) -> object:
    try:
        value = ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str | int | tuple) else None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _loop_values(name: str, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.expr]:
    """What ``name`` takes in the nearest enclosing ``for`` over a literal table."""
    while node in parents:
        node = parents[node]
        if not isinstance(node, ast.For) or not isinstance(node.iter, ast.Tuple | ast.List):
            continue
        target = node.target
        names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [])
        for position, element in enumerate(names):
            if isinstance(element, ast.Name) and element.id == name:
                rows = node.iter.elts
                if isinstance(target, ast.Name):
                    return list(rows)
                return [r.elts[position] for r in rows if isinstance(r, ast.Tuple | ast.List)]
    return []


def looked_up() -> dict[str, list[str]]:
    """Program -> where ``shutil.which`` looks it up (file:line), in tools/ and tests/."""
    constants = _Constants()
    found: dict[str, list[str]] = {}
    for path in _python_files(PACKAGE, ROOT / "tests"):
        tree = ast.parse(path.read_text())
        scope = constants.scope(path, tree)
        parents = _parents(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "which"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "shutil"
            ):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            [arg] = node.args
            candidates = [arg]
            if isinstance(arg, ast.Name) and scope.resolve(arg) is None:
                candidates = _loop_values(arg.id, node, parents)
            values = [scope.resolve(c) for c in candidates]
            assert candidates and all(isinstance(v, str) for v in values), (
                f"{where}: cannot tell which program shutil.which looks up: name it by a "
                "literal or a module constant"
            )
            for value in values:
                found.setdefault(str(value), []).append(where)
    return found


def run_by_the_external_layer() -> dict[str, list[str]]:
    """Program -> where an argv of the external layer starts with it."""
    constants = _Constants()
    found: dict[str, list[str]] = {}
    for path in _python_files(PACKAGE / "external"):
        tree = ast.parse(path.read_text())
        scope = constants.scope(path, tree)
        parents = _parents(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.List | ast.Tuple) or not node.elts:
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.Compare) and any(
                isinstance(op, ast.In | ast.NotIn) for op in parent.ops
            ):
                continue  # `state in ("activating", ...)`: a set of words, not an argv
            first = scope.resolve(node.elts[0])
            if isinstance(first, str) and PROGRAM.match(first):
                found.setdefault(first, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def run_by_the_tests() -> dict[str, list[str]]:
    """Program -> where a test runs it on this machine through ``subprocess``."""
    found: dict[str, list[str]] = {}
    for path in _python_files(ROOT / "tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "subprocess"
                and node.args
                and isinstance(node.args[0], ast.List)
                and node.args[0].elts
            ):
                continue
            first = _literal(node.args[0].elts[0])
            if isinstance(first, str) and PROGRAM.match(first):
                found.setdefault(first, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def stand_ins() -> set[str]:
    """Every program a test gives a stand-in: ``stand_in(DIR, "NAME", ...)``."""
    names: set[str] = set()
    for path in _python_files(ROOT / "tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "stand_in"
                and len(node.args) >= 2
            ):
                name = _literal(node.args[1])
                if isinstance(name, str):
                    names.add(name)
    return names


def ci_installs() -> dict[str, str]:
    """Program -> the Debian package .ci/run installs when ``command -v PROGRAM`` fails."""
    found: dict[str, str] = {}
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        package = re.search(r"missing\+=\(([a-z0-9.+-]+)\)", line)
        if package:
            for program in re.findall(r"command -v ([A-Za-z0-9._+-]+)", line):
                found[program] = package.group(1)
    return found


@functools.cache
def every_program() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for source in (looked_up(), run_by_the_external_layer(), run_by_the_tests()):
        for program, where in source.items():
            found.setdefault(program, []).extend(where)
    return found


def test_the_programs_are_found_in_the_code() -> None:
    """The reading of the code finds what is known to be there (so an empty reading cannot
    pass the test below)."""
    programs = every_program()
    for program in ("nft", "ip", "ssh", "systemctl", "systemd-analyze", "prometheus", "sh"):
        assert program in programs, sorted(programs)
    assert "nix-instantiate" in looked_up()
    assert "activating" not in programs  # a state compared with, not a program


def test_ci_installs_every_program_the_tests_run() -> None:
    installed, stood_in = ci_installs(), stand_ins()
    missing = []
    for program, where in sorted(every_program().items()):
        if program in installed or program in ESSENTIAL:
            continue
        if program in NOT_INSTALLED:
            reason = NOT_INSTALLED[program]
            if "stand-in" in reason:
                assert program in stood_in, f"{program}: no test gives it a stand-in"
            continue
        missing.append(f"{program} ({', '.join(where[:3])})")
    assert not missing, (
        "programs no line of .ci/run installs: add `command -v PROGRAM >/dev/null || "
        f"missing+=(PACKAGE)`, or say why none is needed: {missing}"
    )


def test_every_reason_is_still_needed() -> None:
    programs = every_program()
    stale = sorted(set(NOT_INSTALLED) - set(programs))
    assert not stale, f"no code runs these any more: {stale}"
    assert not set(NOT_INSTALLED) & set(ci_installs())


def test_a_test_names_the_package_ci_installs() -> None:
    """Where a test says what to install for a missing program (``("nft", "nftables")``, then
    ``apt-get install {package} (.ci/run does)``), that is the package .ci/run installs."""
    installed = ci_installs()
    wrong, checked = [], 0
    for path in _python_files(ROOT / "tests"):
        text = path.read_text()
        if ".ci/run does" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2:
                program, package = (_literal(e) for e in node.elts)
                if (
                    isinstance(program, str)
                    and isinstance(package, str)
                    and program in installed
                    and PROGRAM.match(package)
                ):
                    checked += 1
                    if installed[program] != package:
                        wrong.append(f"{path.name}:{node.lineno}: {program} from {package}")
    assert checked >= 5, checked  # the tests that fail with the package to install were read
    assert not wrong, f"not the package .ci/run installs: {wrong}"
