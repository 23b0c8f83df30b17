"""One list of dependencies: pyproject.toml. The Nix package derives its Python dependencies from
it, so what pip installs and what the flake's `llamanix` package carries cannot drift apart.

- Every third-party import in tools/llamanix is declared in pyproject.toml (module-level ones as
  [project] dependencies; imports inside functions may be an optional group's).
- pkgs/llamanix.nix, evaluated against a python3Packages holding the attribute names recorded in
  tests/data/nixpkgs-python-attrs.txt, depends on exactly pyproject's list; a dependency nixpkgs
  lacks fails its evaluation with llamanix's own message.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tools/llamanix"
RECORDED_ATTRS = ROOT / "tests/data/nixpkgs-python-attrs.txt"
# A real nixpkgs lib (its lib/ directory) to evaluate with instead of the stub; CI has none.
REAL_LIB = os.environ.get("LLAMANIX_NIXPKGS_LIB", "")

needs_nix = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")


def normalized(requirement: str) -> str:
    """PEP 503: the project name of a PEP 508 requirement, lower case, -_. runs as one -."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert m, requirement
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def recorded_attrs() -> set[str]:
    lines = RECORDED_ATTRS.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def third_party_imports(package: Path) -> dict[str, tuple[set[str], set[str]]]:
    """Top-level import name -> (files importing it at module level, files importing it in a
    function or class body). The standard library and llamanix itself are left out."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "litellm_plugin":
            continue  # LiteLLM runs it, with its own dependencies (render/gateway.py)
        tree = ast.parse(path.read_text(), str(path))
        module_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "llamanix" or top == "__future__":
                    continue
                where = found.setdefault(top, (set(), set()))
                rel = str(path.relative_to(ROOT))
                (where[0] if id(node) in module_level else where[1]).add(rel)
    return found


def distribution_of(import_name: str) -> str:
    dists = importlib.metadata.packages_distributions().get(import_name)
    assert dists, f"{import_name} is imported but no installed distribution provides it"
    return normalized(dists[0])


def test_every_third_party_import_is_declared() -> None:
    project = pyproject()["project"]
    required = {normalized(r) for r in project["dependencies"]}
    optional = {normalized(r) for group in project["optional-dependencies"].values() for r in group}
    imports = third_party_imports(PACKAGE)
    assert {"click", "httpx", "tomlkit"} <= set(imports)  # the walk sees the package's imports
    for name, (at_module_level, in_functions) in imports.items():
        dist = distribution_of(name)
        if at_module_level:
            assert dist in required, (
                f"{sorted(at_module_level)} import {name} at module level: add {dist} to "
                "[project] dependencies in pyproject.toml"
            )
        else:
            assert dist in required | optional, (
                f"{sorted(in_functions)} import {name}: declare {dist} in pyproject.toml"
            )


def test_every_declared_dependency_is_imported() -> None:
    """A dependency nobody imports is dead weight in every closure (and a stale list)."""
    imported = {distribution_of(name) for name in third_party_imports(PACKAGE)}
    for requirement in pyproject()["project"]["dependencies"]:
        assert normalized(requirement) in imported, f"{requirement}: not imported by llamanix"


def test_recorded_nixpkgs_attrs_cover_every_dependency() -> None:
    project = pyproject()["project"]
    every = [*project["dependencies"], *project["optional-dependencies"]["plot"]]
    every += project["optional-dependencies"]["test"]
    missing = {normalized(r) for r in every} - recorded_attrs()
    assert not missing, (
        f"{sorted(missing)}: confirm the python3Packages attribute in nixpkgs, then list it in "
        f"{RECORDED_ATTRS.relative_to(ROOT)} (or map the name in nix/lib.nix pythonAttrOverrides)"
    )


def eval_package(src: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/llamanix-package.nix"), "--argstr", "libPath", REAL_LIB]
    argv += ["--argstr", "src", str(src) if src else ""]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@needs_nix
def test_nix_package_depends_on_exactly_pyprojects_list() -> None:
    proc = eval_package()
    assert proc.returncode == 0, proc.stderr
    package = json.loads(proc.stdout)
    project = pyproject()["project"]
    assert package["pname"] == project["name"] and package["version"] == project["version"]
    assert package["dependencies"] == [normalized(r) for r in project["dependencies"]]
    groups = project["optional-dependencies"]
    assert package["plot"] == [normalized(r) for r in groups["plot"]]
    assert package["test"] == [normalized(r) for r in groups["test"]]
    assert package["buildSystem"] == ["setuptools"]


@needs_nix
def test_a_dependency_nixpkgs_lacks_fails_the_package_with_one_line(tmp_path: Path) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '  "tomlkit>=0.12",\n' in text
    (tmp_path / "pyproject.toml").write_text(
        text.replace('  "tomlkit>=0.12",\n', '  "tomlkit>=0.12",\n  "no-such-package>=1",\n')
    )
    proc = eval_package(tmp_path)
    assert proc.returncode != 0
    assert (
        "llamanix: pyproject.toml names 'no-such-package', which python3Packages lacks; "
        "map it in nix/lib.nix pythonAttrOverrides"
    ) in proc.stderr


@needs_nix
def test_install_check_runs_one_command_of_every_cli_group() -> None:
    proc = eval_package()
    assert proc.returncode == 0, proc.stderr
    package = json.loads(proc.stdout)
    from llamanix.cli import COMMAND_GROUPS, load_all

    groups_checked = {
        group
        for group, names in COMMAND_GROUPS.items()
        for name in package["helpChecks"]
        if name in names
    }
    assert groups_checked == set(COMMAND_GROUPS)
    assert all(name in load_all() for name in package["helpChecks"])
    phase = package["installCheckPhase"]
    assert "for command in" in phase and '"$command" --help' in phase
    assert "pkgutil.walk_packages" in phase  # every module is imported, not only the CLI's
    # The same commands, run here: their --help loads the modules they import.
    for name in package["helpChecks"]:
        out = subprocess.run(
            [sys.executable, "-m", "llamanix", name, "--help"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("requirement", "attr"),
    [
        ("prometheus-client>=0.20", "prometheus-client"),
        ("Prometheus_Client >= 0.20", "prometheus-client"),
        ("zope.interface; python_version > '3'", "zope-interface"),
        ("jinja2", "jinja2"),
    ],
)
def test_requirement_names_normalise_like_pep_503(requirement: str, attr: str) -> None:
    assert normalized(requirement) == attr
    if shutil.which("nix-instantiate"):
        expr = f"(import {ROOT}/nix/lib.nix).pythonAttrOf {{ }} {json.dumps(requirement)}"
        out = subprocess.run(
            ["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert json.loads(out) == attr


@needs_nix
def test_attr_overrides_map_a_differing_name() -> None:
    expr = f'(import {ROOT}/nix/lib.nix).pythonAttrOf {{ "foo-bar" = "foobar"; }} "Foo_Bar>=1"'
    out = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == "foobar"
