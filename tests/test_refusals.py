"""Every mistake: one line naming the file and the field with a fix, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.render import units
from llamanix.state.config_edit import apply_sets

BASE = """
[hosts.gpu1]
kind = "nixos"

[instances.a]
{a}

[instances.b]
host = "gpu1"
model = "/m/t.gguf"
port = 8081
{b}
"""

H = 'host = "gpu1"\nmodel = "/m/t.gguf"\n'
CASES: list[tuple[str, str, str, str]] = [
    # (id, text for instance a, field, words the line must contain)
    (
        "unknown variant",
        H + 'variant = "upstrem"',
        "instances.a.variant",
        "unknown value 'upstrem' (did you mean 'upstream'?)",
    ),
    (
        "unknown key",
        H + "contxt = 4096",
        "instances.a.contxt",
        "unknown key (did you mean 'context'?)",
    ),
    (
        "unknown spec type",
        H + '[instances.a.speculative]\ntype = "drafts"',
        "instances.a.speculative.type",
        "unknown value 'drafts' (did you mean 'draft'?)",
    ),
    (
        "mtp on nixpkgs",
        H + 'variant = "nixpkgs"\n[instances.a.speculative]\ntype = "mtp"',
        "instances.a.speculative.type",
        "'mtp' is not supported by the nixpkgs variant",
    ),
    (
        "quantized V without FA",
        H + 'flash_attn = "off"\ncache_type_v = "q4_0"',
        "instances.a.flash_attn",
        "a quantized V cache (q4_0) needs flash attention",
    ),
    (
        "ik speculation with parallel > 1",
        H + 'variant = "ik"\nparallel = 2\n[instances.a.speculative]\ntype = "ngram-mod"',
        "instances.a.parallel",
        "speculates only with one slot",
    ),
    (
        "draft without draft_model",
        H + '[instances.a.speculative]\ntype = "draft"',
        "instances.a.speculative.draft_model",
        "type 'draft' needs a draft model",
    ),
    (
        "two instances on one port",
        H + "port = 8081",
        "instances.b.port",
        "port 8081 on host 'gpu1' is already used by instance 'a'",
    ),
    (
        "relative model path",
        'host = "gpu1"\nmodel = "models/t.gguf"',
        "instances.a.model",
        "'models/t.gguf' is a relative path (use an absolute path)",
    ),
    (
        "p_min outside [0, 1]",
        H + '[instances.a.speculative]\ntype = "mtp"\np_min = 1.5',
        "instances.a.speculative.p_min",
        "1.5 is above the maximum 1 (use a value from 0 to 1)",
    ),
    (
        "n_min > n_max",
        H
        + '[instances.a.speculative]\ntype = "draft"\ndraft_model = "/m/d.gguf"\n'
        + "n_max = 2\nn_min = 4",
        "instances.a.speculative.n_min",
        "n_min 4 is larger than n_max 2",
    ),
    ("context <= 0", H + "context = 0", "instances.a.context", "0 is below the minimum 1"),
    (
        "unknown host",
        'host = "gpu2"\nmodel = "/m/t.gguf"',
        "instances.a.host",
        "no host 'gpu2' is defined",
    ),
    (
        "ik gpu_layers auto",
        H + 'variant = "ik"\ngpu_layers = "auto"',
        "instances.a.gpu_layers",
        "takes a layer count, not 'auto'",
    ),
    (
        "API key in environment",
        H + 'environment = { LLAMA_API_KEY = "x" }',
        "instances.a.environment.LLAMA_API_KEY",
        "use api_key_file instead",
    ),
    ("wrong type", H + 'port = "8080"', "instances.a.port", "must be an integer, got '8080'"),
    (
        "context past any machine",
        H + "context = 99999999999999999999999999",
        "instances.a.context",
        "99999999999999999999999999 is above the maximum 16777216 (use a value from 1 to 16777216)",
    ),
    (
        "parallel past llama.cpp's slots",
        H + "parallel = 100000000000",
        "instances.a.parallel",
        "100000000000 is above the maximum 256 (use a value from 1 to 256)",
    ),
    (
        "port in integers, not 1e+26",
        H + "port = 100000000000000000000000000",
        "instances.a.port",
        "100000000000000000000000000 is above the maximum 65535 (use a value from 1 to 65535)",
    ),
    (
        "threads past ggml's",
        H + "threads = 4096",
        "instances.a.threads",
        "4096 is above the maximum 512",
    ),
    (
        "gpu_layers past any model",
        H + "gpu_layers = 100000",
        "instances.a.gpu_layers",
        '100000 is above the maximum 9999 (write "all" to offload every layer)',
    ),
    (
        "n_max past any draft",
        H + '[instances.a.speculative]\ntype = "ngram-mod"\nn_max = 65536',
        "instances.a.speculative.n_max",
        "65536 is above the maximum 1024",
    ),
    (
        "a port a dynamic user cannot bind",
        H + "port = 80",
        "instances.a.port",
        "port 80 is below 1024, and the unit runs as a dynamic user without capabilities, which "
        "cannot bind it (use a port of 1024 or above, e.g. 8080, and put a reverse proxy on the "
        "low port if clients need it)",
    ),
    (
        "extra_args repeating --port",
        H + 'extra_args = ["--port", "9"]',
        "instances.a.extra_args",
        "repeats --port (--port 9), which llamanix renders from port (--port 8080); llama-server "
        "would take the one given last (remove it from extra_args and set port = 9 instead)",
    ),
    (
        "extra_args repeating the context under its long name",
        H + 'context = 4096\nextra_args = ["--ctx-size=8192"]',
        "instances.a.extra_args",
        "repeats --ctx-size (--ctx-size=8192), which llamanix renders from context (-c 4096); "
        "llama-server would take the one given last (remove it from extra_args and set context "
        "= 8192 instead)",
    ),
    (
        "extra_args repeating a flag without a value",
        H + 'extra_args = ["--metrics"]',
        "instances.a.extra_args",
        "repeats --metrics, which llamanix renders already (metrics = true) (remove it from "
        "extra_args)",
    ),
    (
        "an environment value that is not a string",
        H + "environment = { FOO = 1 }",
        "instances.a.environment",
        'must be a table of strings, got 1 for FOO (quote it: FOO = "1")',
    ),
    (
        "ik_llama for ik",
        H + 'variant = "ik_llama"',
        "instances.a.variant",
        "unknown value 'ik_llama' (did you mean 'ik'? variant ik is ikawrakow/ik_llama.cpp fork)",
    ),
    (
        "ik-llama for ik",
        H + 'variant = "ik-llama"',
        "instances.a.variant",
        "(did you mean 'ik'? variant ik is ikawrakow/ik_llama.cpp fork)",
    ),
    (
        "ik_llama.cpp for ik",
        H + 'variant = "ik_llama.cpp"',
        "instances.a.variant",
        "(did you mean 'ik'? variant ik is ikawrakow/ik_llama.cpp fork)",
    ),
    (
        "llama.cpp for upstream",
        H + 'variant = "llama.cpp"',
        "instances.a.variant",
        "(did you mean 'upstream'? variant upstream is ggml-org/llama.cpp master)",
    ),
    (
        "master for upstream",
        H + 'variant = "master"',
        "instances.a.variant",
        "(did you mean 'upstream'? variant upstream is ggml-org/llama.cpp master)",
    ),
]

# Host tables a unit could not run with: (id, the host table's keys, field, the line's end).
HOST_CASES: list[tuple[str, str, str, str]] = [
    (
        "a compute capability no CUDA release has",
        'cuda_archs = ["8.8"]',
        "hosts.gpu1.cuda_archs",
        "'8.8' is no CUDA compute capability (nvcc would refuse it when the variant is built) "
        "(did you mean '8.9'?; nvidia-smi --query-gpu=compute_cap --format=csv prints the "
        "card's, and the known ones are 3.5, 3.7, 5.0, 5.2, 6.0, 6.1, 7.0, 7.2, 7.5, 8.0, 8.6, "
        "8.7, 8.9, 9.0, 10.0, 10.1, 10.3, 11.0, 12.0, 12.1)",
    ),
    (
        "a GPU the archs build no code for",
        'gpu = "rtx5090"\ncuda_archs = ["8.6"]',
        "hosts.gpu1.cuda_archs",
        # plan's warning and doctor's finding, in the same words (core.gpus.arch_mismatch).
        "NVIDIA GeForce RTX 5090 has compute capability 12.0 but host gpu1 builds for 8.6: "
        "kernels are JIT-compiled from PTX on first use (a first prefill of 33 s in one report) "
        'or fail outright (add "12.0" to hosts.gpu1.cuda_archs and rebuild)',
    ),
    (
        "a router on a low port",
        'router = { kind = "llama-server", members = ["a"], port = 443 }',
        "hosts.gpu1.router.port",
        "port 443 is below 1024",
    ),
]


@pytest.mark.parametrize(
    ("case", "keys", "field", "words"), HOST_CASES, ids=[c[0] for c in HOST_CASES]
)
def test_a_host_table_a_unit_cannot_use_is_refused(
    tmp_path: Path, case: str, keys: str, field: str, words: str
) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        BASE.replace('kind = "nixos"', f'kind = "nixos"\n{keys}')
        .replace("{a}", H)
        .replace("{b}", "")
    )
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"{cfg}: {field}: "), line
    assert line.endswith(words) or words in line


def write(tmp_path: Path, a: str, b: str = "") -> Path:
    path = tmp_path / "llamanix.toml"
    path.write_text(BASE.replace("{a}", a).replace("{b}", b))
    return path


@pytest.mark.parametrize(("case", "a", "field", "words"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_one_clear_line(
    tmp_path: Path, case: str, a: str, field: str, words: str
) -> None:
    cfg = write(tmp_path, a)
    out = tmp_path / "out"
    for args in (["validate", str(cfg)], ["render", str(cfg), "--out", str(out)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"{cfg}: {field}: "), lines[0]
        assert words in lines[0]
        assert "Traceback" not in result.output
    assert not out.exists()


def test_toml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text('[instances.a]\nmodel = "/m/t.gguf"\ncontext = = 3\n')
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"{cfg}: TOML syntax error: Invalid value (at line 3, column 11) "
        "(fix the syntax at that line and column)"
    )


def test_several_problems_are_all_listed(tmp_path: Path) -> None:
    cfg = write(tmp_path, H + 'context = 0\nflash_attn = "of"', 'variant = "ikk"')
    result = CliRunner().invoke(main, ["validate", str(cfg)])
    assert result.exit_code == 2
    fields = [line.split(": ")[1] for line in result.stderr.strip().splitlines()]
    assert fields == ["instances.a.context", "instances.a.flash_attn", "instances.b.variant"]


def test_missing_file_and_a_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"{tmp_path / 'nope.toml'}: no such file (check the path)"


def test_real_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    cfg = write(tmp_path, H + 'variant = "upstrem"')
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "validate", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_render_bad_host_writes_nothing(tmp_path: Path) -> None:
    cfg = write(tmp_path, H)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", str(cfg), "--out", str(out), "--host", "gpu9"])
    assert result.exit_code == 2
    # In the config's terms: the name may come from anywhere, the table is what is missing.
    assert result.stderr.strip() == f"{cfg}: hosts: no [hosts.gpu9] table (did you mean 'gpu1'?)"
    assert not out.exists()


# --- no silent fallback --------------------------------------------------------------------------

DEBIAN = """
[hosts.box]
kind = "{kind}"
binaries = {{ upstream = "/usr/local/bin/llama-server" }}

[instances.chat]
variant = "{variant}"
model = "/srv/models/q.gguf"
port = 8080
"""


@pytest.mark.parametrize("kind", ["systemd", "systemd-user"])
def test_a_variant_without_a_binary_is_refused_by_every_command(tmp_path: Path, kind: str) -> None:
    """A host that runs the binaries the config names, and none for the variant: refused with
    the fix, never rendered as a bare llama-server that PATH resolves to another build."""
    ik = tmp_path / "ik.toml"
    ik.write_text(DEBIAN.format(kind=kind, variant="ik"))
    upstream = tmp_path / "llamanix.toml"
    upstream.write_text(DEBIAN.format(kind=kind, variant="upstream"))
    out = tmp_path / "out"
    line = (
        f"instances.chat.variant: host 'box' (kind {kind}) has no llama-server for variant ik "
        "(hosts.box.binaries names only upstream) (set hosts.box.binaries.ik = "
        '"/path/to/ik/llama-server" (or instances.chat.binary), or choose a variant it names)'
    )
    for cfg, args in (
        (ik, ["validate", str(ik)]),
        (ik, ["plan", "--no-security", str(ik)]),
        (ik, ["render", str(ik), "--out", str(out)]),
        (ik, ["plan", str(ik), "chat", "--argv"]),
        (upstream, ["plan", str(upstream), "chat", "--argv", "--variant", "ik"]),
        (upstream, ["switch", str(upstream), "--set", "instances.chat.variant=ik", "--dry-run"]),
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stdout == ""
        assert result.stderr.strip() == f"{cfg}: {line}", args
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ik.toml", "llamanix.toml"]
    assert "upstream" in upstream.read_text()


def test_gpu_layers_on_a_host_that_names_no_gpu_are_refused(tmp_path: Path) -> None:
    """Its unit gets a private /dev: a CUDA build would find no GPU and serve from the CPU."""
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(DEBIAN.format(kind="systemd", variant="upstream") + 'gpu_layers = "all"\n')
    result = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"{cfg}: instances.chat.gpu_layers: host 'box' names no GPU (gpu or cuda_archs), so its "
        'units cannot open the NVIDIA devices and gpu_layers = "all" would run on the CPU (set '
        'hosts.box.gpu = "rtx3090" (llamanix model ceiling --list) or hosts.box.cuda_archs, or '
        "gpu_layers = 0)"
    )
    cfg.write_text(cfg.read_text().replace('kind = "systemd"', 'kind = "systemd"\ngpu = "rtx3090"'))
    assert CliRunner().invoke(main, ["validate", "--remote", str(cfg)]).exit_code == 0


# --- config and command-line edges ---------------------------------------------------------------


def test_a_byte_order_mark_is_read_as_utf8(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + DEBIAN.format(kind="systemd", variant="upstream").encode())
    result = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert result.exit_code == 0, result.output
    switch = ["switch", str(cfg), "--set", "instances.chat.context=4096", "--dry-run"]
    result = CliRunner().invoke(main, switch)
    assert result.exit_code == 0, result.output


def test_a_byte_that_is_not_utf8_is_named_by_line(tmp_path: Path) -> None:
    cfg = tmp_path / "llamanix.toml"
    text = DEBIAN.format(kind="systemd", variant="upstream").replace("port", "# café\nport")
    cfg.write_bytes(text.encode("latin-1"))
    before = cfg.read_bytes()
    line = (
        f"{cfg}: line 9, column 6: byte 0xe9 is not UTF-8 "
        "(save the file as UTF-8, e.g. with iconv -f latin1 -t utf-8)"
    )
    for args in (
        ["validate", str(cfg)],
        ["plan", str(cfg)],
        ["switch", str(cfg), "--set", "instances.chat.context=4096", "--dry-run"],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.stderr.strip() == line, args
    assert cfg.read_bytes() == before


SETS: list[tuple[str, str, str]] = [
    # (id, --set, the line after "CONFIG: --set: ")
    (
        "an instance the config has not",
        "instances.qwen.variant=ik",
        "no instance 'qwen' in this config (known: chat, a.b) (name one of its instances, or add "
        "[instances.qwen] to the file first)",
    ),
    (
        "a misspelt instance",
        "instances.caht.context=4096",
        "no instance 'caht' in this config (did you mean 'chat'?) (name one of its instances, "
        "or add [instances.caht] to the file first)",
    ),
    (
        "a misspelt host",
        "hosts.bx.gpu=rtx3090",
        "no host 'bx' in this config (did you mean 'box'?) (name one of its hosts, or add "
        "[hosts.bx] to the file first)",
    ),
    (
        "a dotted name unquoted",
        "instances.a.b.variant=ik",
        "no instance 'a', but one 'a.b' (quote a name with a dot in it: "
        'instances."a.b".variant=...)',
    ),
    (
        "not a TOML key",
        "instances..variant=ik",
        "'instances..variant=ik' is not KEY=VALUE with a TOML key (write e.g. --set "
        'instances.qwen.variant=ik, and quote a name with a dot: instances."a.b".variant=ik)',
    ),
    (
        "a lone surrogate (bytes argv could not decode)",
        "instances.chat.alias=caf\udce9",
        "'instances.chat.alias=caf\\xe9' is not UTF-8 text (pass it as UTF-8 text)",
    ),
]


def dotted_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(
        DEBIAN.format(kind="systemd", variant="upstream")
        + '\n[instances."a.b"]\nmodel = "/srv/models/q.gguf"\nport = 8081\n'
    )
    return cfg


@pytest.mark.parametrize(("case", "item", "line"), SETS, ids=[c[0] for c in SETS])
def test_a_set_that_names_nothing_is_refused(
    tmp_path: Path, case: str, item: str, line: str
) -> None:
    cfg = dotted_config(tmp_path)
    before = cfg.read_text()
    result = CliRunner().invoke(main, ["switch", str(cfg), "--set", item, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"{cfg}: --set: {line}"
    assert cfg.read_text() == before


def test_a_set_addresses_a_dotted_name_quoted(tmp_path: Path) -> None:
    cfg = dotted_config(tmp_path)
    text = apply_sets(cfg, cfg.read_text(), ('instances."a.b".port=9000',))
    assert tomllib.loads(text)["instances"]["a.b"]["port"] == 9000
    assert '[instances."a.b"]' in text and "a.b.port" not in text
    result = CliRunner().invoke(
        main, ["switch", str(cfg), "--set", 'instances."a.b".port=9000', "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "switching a.b, chat via systemd" in result.stdout


def test_a_set_of_bytes_that_are_not_utf8_writes_nothing(tmp_path: Path) -> None:
    """Through a real argv: the bytes reach llamanix as Python decodes them (surrogates)."""
    cfg = dotted_config(tmp_path)
    before = cfg.read_text()
    for dry in ([b"--dry-run"], []):
        head = map(os.fsencode, (sys.executable, "-m", "llamanix", "switch", cfg))
        proc = subprocess.run(
            [*head, *dry, b"--set", b"instances.chat.alias=caf\xe9"],
            capture_output=True,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.decode().strip() == (
            f"{cfg}: --set: 'instances.chat.alias=caf\\xe9' is not UTF-8 text "
            "(pass it as UTF-8 text)"
        )
    assert cfg.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llamanix.toml"]


def test_validate_takes_several_files(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(DEBIAN.format(kind="systemd", variant="upstream"))
    bad = write(tmp_path, H + 'variant = "upstrem"')
    result = CliRunner().invoke(main, ["validate", "--remote", str(good), str(bad)])
    assert result.exit_code == 2
    assert result.stdout == f"{good}: ok (1 instance on 1 host)\n"
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"{bad}: instances.a.variant: unknown value 'upstrem'")
    result = CliRunner().invoke(main, ["validate", "--remote", "--json", str(good), str(bad)])
    assert result.exit_code == 2
    assert [(r["config"], r["ok"]) for r in json.loads(result.stdout)] == [
        (str(good), True),
        (str(bad), False),
    ]


def test_validate_remote_leaves_this_machine_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config for another machine (an example checked from a checkout whose llamanix lives
    in a 0700 home): its units will not run this llamanix, so --remote does not check it."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "llamanix").write_text("#!/bin/sh\n")
    (home / "bin" / "llamanix").chmod(0o755)
    home.chmod(0o700)
    monkeypatch.setattr(units, "llamanix_paths", lambda: [str(home / "bin" / "llamanix")])
    cfg = tmp_path / "llamanix.toml"
    cfg.write_text(DEBIAN.format(kind="systemd", variant="upstream"))
    here = CliRunner().invoke(main, ["validate", str(cfg)])
    assert here.exit_code == 2
    assert f"{cfg}: llamanix itself: {home}/bin/llamanix " in here.stderr
    # The files the units would open are named too where they are not here (a typo's case).
    assert f"{cfg}: instances.chat.model: /srv/models/q.gguf does not exist" in here.stderr
    there = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert there.exit_code == 0, there.output
    # Where a path lies still counts: no unit sees /tmp's files after a reboot.
    cfg.write_text(cfg.read_text().replace("/srv/models/q.gguf", "/tmp/q.gguf"))
    there = CliRunner().invoke(main, ["validate", "--remote", str(cfg)])
    assert there.exit_code == 2
    assert there.stderr.startswith(f"{cfg}: instances.chat.model: /tmp/q.gguf ")
