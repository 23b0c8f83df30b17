"""The package's layers import only downward, and no two modules import each other.

Layers, bottom to top: as ``LAYERS`` lists them (docs/development.md says what each holds). A
module may import its own layer or any layer below; the package root (``llamanix``, which holds
only the version) is below them all. Imports inside functions and under ``TYPE_CHECKING`` count
too: a cycle that only type hints close is still two modules that cannot be understood apart.
Only ``external/`` runs programs and sends signals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tools" / "llamanix"
LAYERS = (
    "core",
    "config",
    "external",
    "model",
    "render",
    "server",
    "bench",
    "diagnose",
    "state",
    "hosts",
    "plan",
    "switch",
    "fleet",
    "observe",
    "testbed",
    "cli",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package that ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        candidates: list[str] = []
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # `from llamanix.bench import bench` imports the module llamanix.bench.bench.
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        for candidate in candidates:
            target = candidate if candidate in known else None
            if target is None and candidate.split(".")[0] == "llamanix":
                # `import llamanix.config.model as c` or an attribute of a module: its module.
                parts = candidate.split(".")
                while parts and ".".join(parts) not in known:
                    parts.pop()
                target = ".".join(parts) if parts else None
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported_modules(name, path, known) for name, path in mods.items()}


def layer_of(module: str) -> int:
    """-1 for the package root and its entry points, else the index in LAYERS."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return -1 if module == "llamanix" else len(LAYERS)
    return LAYERS.index(parts[1])


def test_every_module_belongs_to_a_layer() -> None:
    stray = [
        m
        for m in modules()
        if m not in ("llamanix", "llamanix.__main__") and m.split(".")[1] not in LAYERS
    ]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"


def test_imports_only_go_downward() -> None:
    upward = [
        f"{source} ({LAYERS[layer_of(source)]}) imports {target} ({LAYERS[layer_of(target)]})"
        for source, targets in import_graph().items()
        if 0 <= layer_of(source) < len(LAYERS)
        for target in targets
        if layer_of(target) > layer_of(source) and layer_of(target) < len(LAYERS)
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return components


def test_no_import_cycles() -> None:
    graph = import_graph()
    # A module's import of its own package's __init__ (for a sibling) is not a cycle.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycle_finder_finds_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert strongly_connected(graph) == expected


def test_graph_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llamanix.config.model import Config\n"
        "def f():\n    from llamanix.bench import bench\n"
    )
    found = imported_modules(
        "llamanix.core.m", source, {"llamanix.config.model", "llamanix.bench.bench"}
    )
    assert found == {"llamanix.config.model", "llamanix.bench.bench"}


def imports_subprocess(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "subprocess" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "subprocess":
            return True
    return False


def test_only_external_runs_programs() -> None:
    """Every program llamanix runs is run by a function of ``external/``, where its argv is
    built and tests can record it: no other layer imports subprocess."""
    offenders = [
        name
        for name, path in modules().items()
        if name.split(".")[1:2] != ["external"] and imports_subprocess(path)
    ]
    assert not offenders, f"subprocess imported outside llamanix.external: {offenders}"


def test_the_subprocess_check_sees_each_import_form(tmp_path: Path) -> None:
    for text in (
        "import subprocess\n",
        "from subprocess import run\n",
        "def f():\n    import subprocess as s\n",
    ):
        source = tmp_path / "m.py"
        source.write_text(text)
        assert imports_subprocess(source), text
    (tmp_path / "m.py").write_text("import shlex\n")
    assert not imports_subprocess(tmp_path / "m.py")


# A signal sent: the functions that send one, by module; and a child's own method for it.
SIGNAL_SENDERS = {"os": {"kill", "killpg"}, "signal": {"pthread_kill"}}
SIGNAL_METHODS = {"send_signal"}


def signals_sent(path: Path) -> list[str]:
    """Each place ``path`` sends a signal, or takes hold of a function that does: ``os.kill``,
    ``os.killpg``, ``signal.pthread_kill``, under any alias (``import os as o``, ``from os
    import kill as k``), and ``.send_signal`` of a child. Installing a handler is not sending."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}  # local name -> the module it is
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SIGNAL_SENDERS:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in SIGNAL_SENDERS:
            found += [
                f"{path.name}:{node.lineno}: from {node.module} import {alias.name}"
                for alias in node.names
                if alias.name in SIGNAL_SENDERS[node.module] or alias.name == "*"
            ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        module = aliases.get(owner or "")
        if module is not None and node.attr in SIGNAL_SENDERS[module]:
            found.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
        elif node.attr in SIGNAL_METHODS:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def signal_offenders(mods: dict[str, Path]) -> list[str]:
    return [
        f"{name}: {where}"
        for name, path in mods.items()
        if name.split(".")[1:2] != ["external"]
        for where in signals_sent(path)
    ]


def test_only_external_sends_signals() -> None:
    """Every signal llamanix sends to a process goes through a function of ``external/``
    (external/signals.py), as every program it runs does."""
    offenders = signal_offenders(modules())
    assert not offenders, "signals sent outside llamanix.external:\n" + "\n".join(offenders)


def test_the_signal_check_flags_a_layer_and_spares_external(tmp_path: Path) -> None:
    """crash_point's old line, in deploy and in external: only deploy's is an offence."""
    text = "import os\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    (tmp_path / "crash_point.py").write_text(text)
    (tmp_path / "signals.py").write_text(text)
    mods = {
        "llamanix.state.crash_point": tmp_path / "crash_point.py",
        "llamanix.external.signals": tmp_path / "signals.py",
    }
    assert signal_offenders(mods) == ["llamanix.state.crash_point: crash_point.py:3: os.kill"]


@pytest.mark.parametrize(
    "text",
    [
        "import os\nos.kill(1, 9)\n",
        "import os\ndef f(pgid):\n    os.killpg(pgid, 15)\n",
        "import os as system\nsystem.kill(1, 9)\n",
        "from os import kill\nkill(1, 9)\n",
        "from os import killpg as stop\n",
        "from os import *\n",
        "import signal\nsignal.pthread_kill(1, 2)\n",
        "from signal import pthread_kill as pk\n",
        "import os\nsend = os.kill\n",
        "def stop(proc):\n    proc.send_signal(2)\n",
    ],
)
def test_the_signal_check_sees_each_form(text: str, tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(text)
    assert signals_sent(source), text


def test_the_signal_check_lets_handlers_and_other_kills_be(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import os\nimport signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"  # a handler: not a signal sent
        "os.getpid()\n"
        "def f(host):\n    host.kill()\n"  # a method of llamanix's own (a test host)
        "kill = 3\n"
    )
    assert signals_sent(source) == []


# A room stays a room: past this many lines of its own modules a folder holds more than one job
# and is split by job. external/ is many small modules of one kind (one per program), so exempt.
ROOM_LINES = 5000


def test_no_folder_outgrows_a_room() -> None:
    sizes: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE).as_posix()
        sizes[folder] = sizes.get(folder, 0) + len(path.read_text().splitlines())
    over = {
        folder: lines
        for folder, lines in sorted(sizes.items())
        if lines > ROOM_LINES and folder != "external"
    }
    assert sizes.get("cli", 0) > 1000, sizes  # the count sees the package at all
    assert not over, f"folders over {ROOM_LINES} lines of their own modules: {over}; split by job"
