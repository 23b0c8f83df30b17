"""`llamanix build`: the flake's own package of a variant, built by Nix on a Debian host and
recorded as the host's binary for the variant. Nix cannot build here (no nixpkgs): a recording
stand-in answers for it, and the test asserts the exact argv llamanix runs."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from standins import recorded, recorded_argv, stand_in

from llamanix.cli import main
from llamanix.config.model import load_config
from llamanix.plan import variant_build
from llamanix.plan.variant_build import ARCH_SUFFIXES

REPO = Path(__file__).resolve().parent.parent
HELP = REPO / "tests" / "data" / "help"
NIX = ["nix", "--extra-experimental-features", "nix-command flakes", "build", "--json"]
IK_REV = "de55d9e"  # flake.lock's ik-llama-cpp, as the out link names it

CONFIG = """# the box
[hosts.box]
kind = "systemd"
{gpu}binaries = {{ upstream = "/usr/local/bin/llama-server" }}  # the upstream build

[instances.chat]
model = "/srv/models/q.gguf"
"""


@pytest.fixture
def flake(tmp_path: Path) -> Path:
    """A checkout's flake.nix and flake.lock (only the lock is read; nix is a stand-in)."""
    directory = tmp_path / "llamanix"
    directory.mkdir()
    for name in ("flake.nix", "flake.lock"):
        shutil.copy(REPO / name, directory / name)
    return directory


def nix_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A `nix` that prints what `nix build --json` prints for a store path holding a
    llama-server that answers as the recorded ik build; (its record, the store path)."""
    store = tmp_path / "store" / "5kq0f3jv-llama-cpp-ik-cuda-sm120"
    (store / "bin").mkdir(parents=True)
    answer = tmp_path / "ik.txt"
    answer.write_text(
        (HELP / "ik-de55d9e2.version.txt").read_text() + (HELP / "ik-de55d9e2.help.txt").read_text()
    )
    stand_in(store / "bin", "llama-server", answer, record=tmp_path / "server.jsonl")
    printed = tmp_path / "nix-build.json"
    printed.write_text(
        json.dumps([{"drvPath": "/nix/store/x.drv", "outputs": {"out": str(store)}}])
    )
    record = stand_in(tmp_path / "bin", "nix", printed)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return record, store


def test_the_packages_per_architecture_list_are_the_flakes() -> None:
    """ARCH_SUFFIXES names the flake's packages as nix/lib.nix's archSets does."""
    if shutil.which("nix-instantiate") is None:
        pytest.skip("nix-instantiate is not installed")
    out = subprocess.run(
        [
            "nix-instantiate",
            "--eval",
            "--strict",
            "--json",
            "-E",
            "(import ./nix/lib.nix).archSets",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    arch_sets = {frozenset(archs): suffix for suffix, archs in json.loads(out).items()}
    assert arch_sets == ARCH_SUFFIXES


def test_build_runs_nix_build_and_records_the_binary(
    tmp_path: Path, flake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record, store = nix_stand_in(tmp_path, monkeypatch)
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(CONFIG.format(gpu='gpu = "rtx5090"\ncuda_archs = ["12.0"]\n'))
    roots = tmp_path / "roots"
    args = ["variant", "build", str(cfg), "ik", "--flake", str(flake), "--roots", str(roots)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    out_link = roots / f"llama-cpp-ik-cuda-sm120-{IK_REV}"
    assert recorded_argv(record) == [
        *NIX, "--out-link", str(out_link), f"{flake}#llama-cpp-ik-sm120"
    ]  # fmt: skip
    binary = f"{store}/bin/llama-server"
    assert result.stdout.splitlines() == [
        f"$ nix --extra-experimental-features 'nix-command flakes' build --json --out-link "
        f"{out_link} '{flake}#llama-cpp-ik-sm120'",
        f"hosts.box.binaries.ik = {binary}",
        f"next: llamanix switch {cfg} --set instances.NAME.variant=ik (each instance to run it)",
    ]
    # Written into the host's table, comments kept; the binary was asked what it is.
    assert cfg.read_text() == CONFIG.format(gpu='gpu = "rtx5090"\ncuda_archs = ["12.0"]\n').replace(
        '{ upstream = "/usr/local/bin/llama-server" }',
        # tomlkit's spelling of the table it added a key to
        f'{{ upstream = "/usr/local/bin/llama-server", ik = "{binary}"}}',
    )
    assert [c["argv"][1] for c in recorded(tmp_path / "server.jsonl")] == ["--version", "--help"]
    switch = ["switch", str(cfg), "--set", "instances.chat.variant=ik", "--dry-run"]
    done = CliRunner().invoke(main, switch)
    assert done.exit_code == 0, done.output
    assert (
        f"# probe {binary}: {binary} (version 0, commit ?) speaks the ik dialect, a build of "
        "variant ik's project"
    ) in done.stdout.splitlines()


def test_another_architecture_list_is_built_with_mkvariant(
    tmp_path: Path, flake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RTX 4090 (8.9) has no package of its own: the package set's mkVariant builds it."""
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(CONFIG.format(gpu='gpu = "rtx4090"\n'))
    before = cfg.read_text()
    monkeypatch.setattr(variant_build.os, "uname", lambda: _Uname("x86_64"))
    args = [
        "variant",
        "build",
        str(cfg),
        "beellama",
        "--flake",
        str(flake),
        "--roots",
        "/r",
        "--dry-run",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    expr = (
        f'(builtins.getFlake "{flake}").legacyPackages.x86_64-linux.llamanixPackages.mkVariant '
        '{ variant = "beellama"; cudaArchs = [ "8.9" ]; }'
    )
    plan = variant_build.plan_build(load_config(cfg), None, "beellama", flake, Path("/r"))
    assert plan.argv == [*NIX, "--out-link", "/r/llama-cpp-beellama-cuda-sm89-ba1fdce",
                         "--impure", "--expr", expr]  # fmt: skip
    assert result.stdout.splitlines()[:2] == [
        shlex.join(plan.argv),
        f"# write {cfg}: hosts.box.binaries.beellama = <the build's bin/llama-server>",
    ]
    assert cfg.read_text() == before
    if shutil.which("nix-instantiate") is not None:
        subprocess.run(["nix-instantiate", "--parse", "-E", expr], check=True, capture_output=True)


class _Uname:
    def __init__(self, machine: str) -> None:
        self.machine = machine


@pytest.mark.parametrize(
    ("table", "variant", "flag", "line"),
    [
        (
            'kind = "nixos"\n',
            "ik",
            [],
            "hosts.box.kind: a NixOS host builds its variants itself (nixos-rebuild, from the "
            "module) (switch it to the variant: llamanix switch CONFIG --set "
            "instances.NAME.variant=VARIANT)",
        ),
        (
            'kind = "systemd"\ntarget = "admin@box"\n'
            'binaries = { upstream = "/usr/local/bin/llama-server" }\n',
            "ik",
            [],
            "hosts.box.target: llamanix variant build builds on this machine, and host 'box' is "
            "admin@box "
            "(run it on that host (ssh admin@box), where its units run the binary)",
        ),
    ],
)
def test_build_refuses_a_host_it_cannot_build_for(
    tmp_path: Path, flake: Path, table: str, variant: str, flag: list[str], line: str
) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(f'[hosts.box]\n{table}[instances.chat]\nmodel = "/srv/models/q.gguf"\n')
    result = CliRunner().invoke(
        main, ["variant", "build", str(cfg), variant, "--flake", str(flake), *flag]
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == f"{cfg}: {line}"


def test_build_refuses_an_unknown_variant_and_a_missing_flake(tmp_path: Path, flake: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(CONFIG.format(gpu=""))
    result = CliRunner().invoke(
        main, ["variant", "build", str(cfg), "ik_llama.cpp", "--flake", str(flake)]
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "llamanix variant build: VARIANT: unknown variant 'ik_llama.cpp' (did you mean 'ik'? "
        "variant ik is ikawrakow/ik_llama.cpp fork)"
    )
    result = CliRunner().invoke(main, ["variant", "build", str(cfg), "ik"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"llamanix variant build: --flake: no llamanix flake (flake.nix and flake.lock) in "
        f"{tmp_path} (beside {cfg}) (name your llamanix checkout: --flake ~/src/llamanix)"
    )


def test_the_driver_fix_names_the_drivers_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nixpkgs CUDA build looks for libcuda in /run/opengl-driver/lib: where that is missing,
    the fix links the directory holding the driver's libraries alone (Debian's packages keep
    one), at every boot."""
    monkeypatch.setattr(variant_build, "DRIVER_LINK", tmp_path / "run" / "opengl-driver" / "lib")
    debian = tmp_path / "nvidia" / "current"
    monkeypatch.setattr(variant_build, "DEBIAN_DRIVER_DIR", debian)
    link = tmp_path / "run" / "opengl-driver" / "lib"
    assert variant_build.driver_fix()[0].startswith("sudo install -d /usr/local/lib/nvidia-for-nix")
    debian.mkdir(parents=True)
    (debian / "libcuda.so.1").write_text("")
    assert variant_build.driver_fix() == [
        f"echo 'L+ {link} - - - - {debian}' | sudo tee /etc/tmpfiles.d/llamanix-nvidia.conf",
        "sudo systemd-tmpfiles --create /etc/tmpfiles.d/llamanix-nvidia.conf",
    ]
    link.mkdir(parents=True)
    (link / "libcuda.so.1").write_text("")
    assert variant_build.driver_fix() == []
