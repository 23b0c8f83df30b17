"""``llamanix variant build``: a variant of the flake, built by Nix on a Debian/Ubuntu host,
recorded as that host's binary for the variant.

The flake's own packages are what NixOS hosts run: the same pins (flake.lock), the same cmake
flags (pkgs/llama-cpp-variant.nix: the host's CUDA architectures, the flash-attention kernels
for every K/V type pair), the same binary cache. On a host without NixOS, Nix the package
manager builds that very package; the build's output link under the host's state is its
garbage-collector root, named after the pinned revision, so a generation that ran an older
build keeps its binary until that root is removed. The binary's path then goes into
``hosts.NAME.binaries.VARIANT`` of the config, which a switch to the variant runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from llamanix.config.host_choice import pick_host
from llamanix.config.model import Config, suggest
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.gpus import load_gpus
from llamanix.core.projects import other_project
from llamanix.core.variants import VARIANTS
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import probe_binary
from llamanix.external.nix import locked_revisions
from llamanix.external.nix_build import build_argv, nix_build
from llamanix.external.process import Echo
from llamanix.state.config_edit import apply_sets, parse_text
from llamanix.state.generations import HostState
from llamanix.state.host_lock import host_lock

# The flake's packages per CUDA architecture list: `llama-cpp-VARIANT` plus this suffix
# (nix/lib.nix archSets; tests/test_variant_build.py keeps the two equal). Any other list is
# built with the package set's mkVariant.
ARCH_SUFFIXES: dict[frozenset[str], str] = {
    frozenset({"8.6", "12.0"}): "",
    frozenset({"12.0"}): "-sm120",
    frozenset({"8.6"}): "-sm86",
    frozenset(): "-cpu",
}
# The GC roots of builds, beside the host's other state: a system unit's host, or a user's.
SYSTEM_ROOTS = Path("/var/lib/llamanix/builds")
USER_ROOTS = Path.home() / ".local" / "state" / "llamanix" / "builds"
NIX_SYSTEMS = {"x86_64": "x86_64-linux", "aarch64": "aarch64-linux"}
# Where a CUDA build of nixpkgs looks for the NVIDIA driver's libraries (addDriverRunpath).
DRIVER_LINK = Path("/run/opengl-driver/lib")
# Debian's NVIDIA packages keep the driver's libraries apart, in a directory of their own.
DEBIAN_DRIVER_DIR = Path("/usr/lib/x86_64-linux-gnu/nvidia/current")


@dataclass(frozen=True)
class BuildPlan:
    host: str
    variant: str
    cuda_archs: tuple[str, ...]
    flake_dir: Path
    installable: tuple[str, ...]
    out_link: Path

    @property
    def argv(self) -> list[str]:
        return build_argv(list(self.installable), self.out_link)

    @property
    def key(self) -> str:
        return f"hosts.{self.host}.binaries.{self.variant}"


def _archs(config: Config, host: str) -> tuple[str, ...]:
    table = config.hosts[host]
    if table.cuda_archs:
        return table.cuda_archs
    if table.gpu is not None:
        return (load_gpus()[table.gpu].compute_capability,)
    return ()


def _arch_tag(archs: tuple[str, ...]) -> str:
    if not archs:
        return "cpu"
    return "cuda-" + "-".join("sm" + a.replace(".", "") for a in archs)


def plan_build(
    config: Config, host: str | None, variant: str, flake_dir: Path | None, roots: Path | None
) -> BuildPlan:
    """What ``llamanix variant build CONFIG VARIANT`` runs for ``host`` (the config's only one
    when None)."""
    source = config.source
    name = pick_host(config, host)
    table = config.hosts[name]
    if variant not in VARIANTS:
        raise UserError(
            Problem("llamanix variant build", "VARIANT", f"unknown variant '{variant}'",
                    suggest(variant, tuple(VARIANTS)))
        )  # fmt: skip
    if table.kind == "nixos":
        raise UserError(
            Problem(source, f"hosts.{name}.kind",
                    "a NixOS host builds its variants itself (nixos-rebuild, from the module)",
                    "switch it to the variant: llamanix switch CONFIG --set "
                    "instances.NAME.variant=VARIANT")
        )  # fmt: skip
    if table.target is not None:
        raise UserError(
            Problem(source, f"hosts.{name}.target",
                    f"llamanix variant build builds on this machine, and host '{name}' is "
                    f"{table.target}",
                    f"run it on that host (ssh {table.target}), where its units run the binary")
        )  # fmt: skip
    flake = (flake_dir or Path(source).resolve().parent).absolute()
    if not (flake / "flake.nix").is_file() or not (flake / "flake.lock").is_file():
        where = "--flake" if flake_dir is not None else f"beside {source}"
        raise UserError(
            Problem("llamanix variant build", "--flake",
                    f"no llamanix flake (flake.nix and flake.lock) in {flake} ({where})",
                    "name your llamanix checkout: --flake ~/src/llamanix")
        )  # fmt: skip
    archs = _archs(config, name)
    v = VARIANTS[variant]
    revision = locked_revisions(flake).get(v.flake_input or "nixpkgs", "")
    suffix = ARCH_SUFFIXES.get(frozenset(archs))
    if suffix is not None:
        installable: tuple[str, ...] = (f"{flake}#llama-cpp-{variant}{suffix}",)
    else:
        system = NIX_SYSTEMS.get(os.uname().machine)
        if system is None:
            raise UserError(
                Problem("llamanix variant build", "",
                        f"the flake builds for {', '.join(NIX_SYSTEMS)} machines, and this one "
                        f"is {os.uname().machine}")
            )  # fmt: skip
        expr = (
            f"(builtins.getFlake {json.dumps(str(flake))}).legacyPackages.{system}"
            f".llamanixPackages.mkVariant {{ variant = {json.dumps(variant)}; cudaArchs = [ "
            + " ".join(json.dumps(a) for a in archs)
            + " ]; }"
        )
        installable = ("--impure", "--expr", expr)
    directory = roots or (USER_ROOTS if table.kind == "systemd-user" else SYSTEM_ROOTS)
    link = f"llama-cpp-{variant}-{_arch_tag(archs)}" + (f"-{revision[:7]}" if revision else "")
    return BuildPlan(name, variant, archs, flake, installable, directory / link)


def driver_fix() -> list[str]:
    """Where a CUDA build of nixpkgs would not find the NVIDIA driver here: the lines that make
    it findable (a directory of the driver's own libraries, linked at every boot), else []."""
    if (DRIVER_LINK / "libcuda.so.1").exists():
        return []
    if (DEBIAN_DRIVER_DIR / "libcuda.so.1").exists():
        target = DEBIAN_DRIVER_DIR
        make = []
    else:
        target = Path("/usr/local/lib/nvidia-for-nix")
        make = [
            f"sudo install -d {target}",
            "sudo ln -sf /usr/lib/x86_64-linux-gnu/libcuda.so* "
            f"/usr/lib/x86_64-linux-gnu/libnvidia-*.so* {target}/",
        ]
    return [
        *make,
        f"echo 'L+ {DRIVER_LINK} - - - - {target}' | sudo tee /etc/tmpfiles.d/llamanix-nvidia.conf",
        "sudo systemd-tmpfiles --create /etc/tmpfiles.d/llamanix-nvidia.conf",
    ]


def record_binary(config_path: Path, plan: BuildPlan, binary: str) -> None:
    """Write ``hosts.HOST.binaries.VARIANT = BINARY`` into the config (comments kept), checked
    as a switch checks its edits, under the host's lock."""
    key = f"hosts.{json.dumps(plan.host)}.binaries.{plan.variant}={json.dumps(binary)}"
    with host_lock(
        HostState.beside(config_path, plan.host).root, f"host {plan.host}", str(config_path),
        command="build",
    ):  # fmt: skip
        text = config_path.read_text()
        new = apply_sets(config_path, text, (key,))
        parse_text(config_path, new)
        atomic_write(config_path, new, config_path.stat().st_mode & 0o777)


def run_build(config_path: Path, plan: BuildPlan, echo: Echo, dry_run: bool) -> str | None:
    """Build, check what was built, record it; the binary's path (None in a dry run)."""
    from shlex import join

    echo(join(plan.argv) if dry_run else f"$ {join(plan.argv)}")
    if dry_run:
        echo(f"# write {config_path}: {plan.key} = <the build's bin/llama-server>")
        return None
    store = nix_build(plan.argv)
    binary = f"{store}/bin/llama-server"
    if not os.access(binary, os.X_OK):
        raise ExternalCommandError(f"the build {store} has no bin/llama-server")
    try:
        caps = probe_binary(binary)
    except (UserError, ExternalCommandError) as err:
        echo(f"warning: {binary} cannot be asked what it is here: {str(err).splitlines()[0]}")
        for line in driver_fix() if plan.cuda_archs else []:
            echo(f"  {line}")
    else:
        other = other_project(VARIANTS[plan.variant], caps)
        if other is not None:  # the flake's package of another project: a bug, not a config
            raise ExternalCommandError(other.message(caps, plan.variant))
    record_binary(config_path, plan, binary)
    echo(f"{plan.key} = {binary}")
    return binary
