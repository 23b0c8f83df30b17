"""The Nix blocks of README.md and docs/*.md evaluate, as a NixOS host evaluates them.

Every ``nix`` block parses, as a file or as bindings (a snippet such as
``services.llamanix.useSystemNixpkgs = true;``), in CI. With LLAMANIX_NIXPKGS_LIB
(scripts/nix-real-lib) each one is evaluated with nixpkgs' real lib by tests/nix/doc-eval.nix:

- a module (a snippet is the body of ``{ config, lib, pkgs, llamanix, ... }:``) beside the
  flake's ``nixosModules.default``, with no specialArgs: ``llamanix`` comes from the module;
- a ``flake.nix``, or a snippet of its outputs, through a stand-in ``nixosSystem`` over the
  modules it lists: ``./configuration.nix`` (empty: yours) and ``./llm.nix``, the document's
  own ``# llm.nix`` blocks (the last one of each part);
- flake inputs: each ``inputs.llamanix.inputs.NAME`` must be an input of this flake.

``./llamanix.toml`` is the document's own ``file:`` block of that name, else a repository
config with the host the block names (DEFAULT_TOML). A block evaluates when nothing throws and
no assertion fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import Block, all_blocks

ROOT = Path(__file__).resolve().parent.parent
REAL_LIB = os.environ.get("LLAMANIX_NIXPKGS_LIB", "")
LITELLM_MODULE = os.environ.get("LLAMANIX_NIXPKGS_LITELLM", "")
BLOCKS = [b for b in all_blocks() if b.language == "nix"]
# The config a block's ./llamanix.toml stands for, by the host it builds, where its document
# has none of its own.
DEFAULT_TOML = {
    "gpu1": ROOT / "examples/rtx5090-qwen27b-draft.toml",
    "box3": ROOT / "tests/data/fleet-gateway-nixos.toml",
}
_TOML_HOST = re.compile(r'(?:fromToml|instancesFromToml) \./llamanix\.toml "([^"]+)"')
_BINDING = re.compile(r"^([A-Za-z_][A-Za-z0-9_'-]*)\s*[.=]")
_LLM_PART = re.compile(r"^# llm\.nix(?:, part (\d+))?")

pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="needs Nix")


def text_of(block: Block) -> str:
    return "\n".join(block.body) + "\n"


def parses(text: str) -> bool:
    proc = subprocess.run(
        ["nix-instantiate", "--parse", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    return proc.returncode == 0


def bindings(text: str) -> list[str]:
    """The top-level names a snippet of bindings defines (``services.x = ...`` -> services)."""
    return [m.group(1) for line in text.splitlines() if (m := _BINDING.match(line))]


def as_file(text: str) -> tuple[str, str]:
    """(kind, the text as a file doc-eval.nix imports) for one block."""
    if parses(text):
        return ("flake" if re.search(r"^\s*outputs\s*=", text, re.M) else "module"), text
    names = set(bindings(text))
    if names == {"inputs"}:
        return "inputs", "{\n" + text + "}\n"
    if names == {"nixosConfigurations"}:
        return "outputs", "{ nixpkgs, llamanix, ... }:\n{\n" + text + "}\n"
    return "module", "{ config, lib, pkgs, llamanix, ... }:\n{\n" + text + "}\n"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_every_nix_block_parses(block: Block) -> None:
    """As a file, or as bindings a module or a flake holds: one file per block (a block that
    holds two files, say, parses as neither)."""
    kind, text = as_file(text_of(block))
    assert parses(text), f"{block.id}: neither a Nix file nor bindings ({kind})"


def llm_parts(doc: str) -> list[str]:
    """The document's llm.nix: its blocks titled `# llm.nix`, the last of each part."""
    parts: dict[str, str] = {}
    for block in BLOCKS:
        if block.doc == doc and block.body and (m := _LLM_PART.match(block.body[0])):
            parts[m.group(1) or ""] = text_of(block)
    return [parts[k] for k in sorted(parts)]


def toml_text(block: Block, text: str) -> str | None:
    """What ./llamanix.toml holds for this block (None: it reads none)."""
    hosts = set(_TOML_HOST.findall(text))
    if not hosts:
        return None
    [host] = hosts
    for other in all_blocks():
        marker = other.marker("file")
        if other.doc == block.doc and marker is not None and marker.value.endswith("llamanix.toml"):
            return text_of(other)
    return DEFAULT_TOML[host].read_text()


def write_block(block: Block, tmp_path: Path) -> tuple[str, Path]:
    """The block and the files it names, in a directory of their own."""
    kind, text = as_file(text_of(block))
    read = text
    if kind in ("flake", "outputs"):
        parts = llm_parts(block.doc)
        assert parts, f"{block.id}: a flake that lists ./llm.nix, in a document without one"
        names = []
        for i, part in enumerate(parts):
            (tmp_path / f"llm-{i}.nix").write_text(part)
            names.append(f"./llm-{i}.nix")
        (tmp_path / "llm.nix").write_text("{ imports = [ " + " ".join(names) + " ]; }\n")
        (tmp_path / "configuration.nix").write_text("{ }\n")
        read += "".join(parts)
    toml = toml_text(block, read)
    if toml is not None:
        (tmp_path / "llamanix.toml").write_text(toml)
    path = tmp_path / "block.nix"
    path.write_text(text)
    return kind, path


def doc_eval(kind: str, path: Path) -> Any:
    argv = ["nix-instantiate", "--readonly-mode", "--eval", "--strict", "--json"]
    argv += [str(ROOT / "tests/nix/doc-eval.nix"), "--argstr", "libPath", REAL_LIB]
    argv += ["--argstr", "block", str(path), "--argstr", "kind", kind]
    argv += ["--argstr", "litellmModule", LITELLM_MODULE]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(
    not (REAL_LIB and LITELLM_MODULE),
    reason="set LLAMANIX_NIXPKGS_LIB and LLAMANIX_NIXPKGS_LITELLM (scripts/nix-real-lib)",
)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_every_nix_block_evaluates(block: Block, tmp_path: Path) -> None:
    kind, path = write_block(block, tmp_path)
    found = doc_eval(kind, path)
    if kind == "inputs":
        assert found["llamanix"], block.id
        assert set(found["llamanix"]) <= set(found["known"]), block.id
        return
    assert found, f"{block.id}: defines no system"
    text = path.read_text() + "".join(p.read_text() for p in tmp_path.glob("llm-*.nix"))
    for name, system in found.items():
        assert system["failed"] == [], f"{block.id}: {name}"
        if re.search(r"enable = true", text) and "services.llamanix" in text:
            # What it enables is there: the instances' units or the gateway.
            assert system["rendered"] is not None or system["gateway"] is not None, block.id
