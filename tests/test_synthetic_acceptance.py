"""llamanix bench synthetic: the mean length, the argv, a real sweep, refusals, and the old
spelling (bench --synthetic-acceptance), which does the same after one line naming the new one.

The sweep runs the real CPU llama-server with a synthetic model as its own draft. Benchmarks
never assert timings: only the shape of what comes back and what the server logged.
"""

from __future__ import annotations

import json
import re
import stat
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_run import invoke
from click.testing import CliRunner, Result

from llamanix.bench import synthetic_acceptance as synth
from llamanix.bench.bench_results import BenchSettings
from llamanix.bench.prompts import load_prompts
from llamanix.cli import main
from llamanix.config.model import load_config
from llamanix.core.errors import UserError

if TYPE_CHECKING:
    from conftest import SynthModels

HELP_DATA = Path(__file__).parent / "data" / "help"


DEPRECATION = (
    "llamanix: --synthetic-acceptance is deprecated, use "
    "llamanix bench synthetic RATES --config CONFIG --instance NAME"
)


bench = partial(invoke, "bench")


def sweep(config: Path, instance: str, rates: str, *args: str) -> Result:
    """`bench synthetic RATES --config CONFIG --instance NAME ARGS`."""
    return bench("synthetic", rates, "--config", str(config), "--instance", instance, *args)


def write_config(
    path: Path,
    binary: Path | str,
    model: Path | str,
    *,
    spec: bool = True,
    n_max: int | None = None,
    api_key_file: Path | None = None,
    draft_model: Path | str | None = None,
) -> Path:
    lines = [
        '[hosts.dev]\nkind = "nixos"\n',
        "[instances.tiny]",
        'host = "dev"',
        f'model = "{model}"',
        f'binary = "{binary}"',
        "port = 18080",
        "context = 1024",
        "parallel = 1",
        "threads = 1",
    ]
    if api_key_file is not None:
        lines.append(f'api_key_file = "{api_key_file}"')
    if spec:
        lines += ["", "[instances.tiny.speculative]", 'type = "draft"']
        lines.append(f'draft_model = "{draft_model or model}"')
        if n_max is not None:
            lines.append(f"n_max = {n_max}")
    path.write_text("\n".join(lines) + "\n")
    return path


# --- pure -----------------------------------------------------------------------------------


def test_mean_length_is_one_plus_the_geometric_sum() -> None:
    assert synth.mean_length(0.0, 3) == 1.0
    assert synth.mean_length(1.0, 3) == 4.0  # upstream's maximum, n_max + 1
    assert synth.mean_length(0.5, 3) == pytest.approx(1.875)
    assert synth.mean_length(0.6, 4) == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.1296)
    assert synth.mean_length(0.3, 1) == pytest.approx(1.3)
    # Every rate stays inside upstream's [1, n_max + 1], however the floats round.
    for i in range(101):
        for n in (1, 3, 12):
            assert 1.0 <= synth.mean_length(i / 100, n) <= n + 1
    for bad in (-0.1, 1.01, float("nan")):
        with pytest.raises(ValueError):
            synth.mean_length(bad, 3)
    with pytest.raises(ValueError):
        synth.mean_length(0.5, 0)
    assert synth.length_arg(synth.mean_length(0.5, 3)) == "1.875000"


def test_parse_rates() -> None:
    assert synth.parse_rates("0.3,0.6, 0.9") == (0.3, 0.6, 0.9)
    assert synth.parse_rates("0,1") == (0.0, 1.0)
    for bad in ("1.5", "-0.1", "abc", "0.3,,0.6", "nan", "inf"):
        with pytest.raises(UserError, match="llamanix bench synthetic: RATES: "):
            synth.parse_rates(bad)


# --- the argv, from the real binary's probe ---------------------------------------------------


@pytest.mark.server
def test_argv_adds_the_length_and_the_baseline_drops_speculation(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    key = tmp_path / "key.txt"
    key.write_text("secret\n")
    config = load_config(
        write_config(
            tmp_path / "c.toml",
            llama_server_bin,
            synth_models.target,
            n_max=4,
            api_key_file=key,
        )
    )
    plan = synth.plan_sweep(config, "tiny")
    assert plan.n_max == 4 and plan.n_max_source == "speculative.n_max"
    argv = plan.synthetic_argv(0.6)
    assert argv[0] == str(llama_server_bin)
    i = argv.index("--spec-synth-len")
    assert argv[i + 1] == "2.305600"  # 1 + .6 + .36 + .216 + .1296
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    # Loopback, a port of its own at each start (LlamaServer adds a free one), no API key.
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--port" not in argv and "18080" not in argv
    assert "--api-key-file" not in argv and str(key) not in argv
    assert not [a for a in plan.baseline_argv if a.startswith("--spec-")]
    assert str(synth_models.target) in plan.baseline_argv  # the target, once
    assert plan.baseline_argv.count(str(synth_models.target)) == 1
    assert not [a for a in plan.speculative_argv if a.startswith("--spec-synth")]

    default = synth.plan_sweep(
        load_config(write_config(tmp_path / "d.toml", llama_server_bin, synth_models.target)),
        "tiny",
    )
    assert default.n_max == 3 and default.n_max_source == "upstream default for draft"
    assert "--spec-draft-n-max" not in default.speculative_argv
    argv = default.synthetic_argv(0.5)
    assert argv[argv.index("--spec-synth-len") + 1] == "1.875000"


# --- a real sweep -----------------------------------------------------------------------------

SWEEP_OPTIONS = ("--runs", "1", "--warmup", "0", "--max-tokens", "16")


@pytest.mark.server
def test_real_sweep_logs_synthetic_acceptance(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = load_config(write_config(tmp_path / "c.toml", llama_server_bin, synth_models.target))
    plan = synth.plan_sweep(config, "tiny")
    logs = tmp_path / "logs"
    logs.mkdir()
    said: list[str] = []
    result = synth.run_sweep(
        synth.SweepRequest(
            plan=plan,
            rates=(0.3, 0.9),
            settings=BenchSettings(url="http://127.0.0.1", max_tokens=(16,), runs=1, warmup=0),
            prompts=tuple(load_prompts("builtin:fibonacci")),
            log_dir=logs,
        ),
        say=said.append,
    )
    assert [p.acceptance for p in result.points] == [0.3, 0.9]
    assert result.baseline.acceptance is None and result.baseline.decode is not None
    assert not [a for a in result.baseline.argv if a.startswith("--spec-")]
    assert "--port" in result.baseline.argv  # the free port it got
    base_log = (logs / "baseline.log").read_text()
    assert synth.ENABLED_WARNING not in base_log
    for i, point in enumerate(result.points):
        assert point.acceptance is not None
        length = synth.mean_length(point.acceptance, 3)
        assert point.mean_length == length
        argv = list(point.argv)
        assert argv[argv.index("--spec-synth-len") + 1] == synth.length_arg(length)
        log = (logs / f"synthetic-{i}.log").read_text()
        assert synth.ENABLED_WARNING in log
        # Upstream resolves the same length for the draft length we assumed.
        assert point.server.n_max == 3
        assert point.server.mean_length == pytest.approx(length, abs=1e-5)
        assert point.decode is not None and point.decode.n == 1
        assert point.speedup is not None and point.speedup > 0
        assert point.speedup_interval is None  # one run a side: no honest interval
        assert point.drafted_acceptance is not None and 0 <= point.drafted_acceptance <= 1
    assert result.notes == ()
    assert said[0] == "baseline: starting llama-server"
    assert sum("starting llama-server" in line for line in said) == 3


@pytest.mark.server
def test_cli_sweep_prints_the_table_and_writes_json(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.toml", llama_server_bin, synth_models.target)
    out = tmp_path / "sweep.json"
    result = sweep(
        config, "tiny", "0.3,0.9", "--prompts", "builtin:fibonacci", *SWEEP_OPTIONS, "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "deprecated" not in result.stderr
    for text in ("acceptance p", "mean length L", "decode tok/s", "speedup", "baseline", "1.417"):
        assert text in result.stdout, text
    data = json.loads(out.read_text())
    assert data["format"] == "llamanix-synthetic-acceptance/1" and data["benchmark_only"]
    assert (data["instance"], data["n_max"]) == ("tiny", 3)
    assert [p["acceptance"] for p in data["points"]] == [0.3, 0.9]
    assert data["points"][1]["mean_length"] == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    for point in [data["baseline"], *data["points"]]:
        assert set(point["decode_tok_s"]) == {"n", "mean", "median", "min", "max"}
        assert point["bench"]["format"] == "llamanix-bench/1"  # -o keeps every run
    assert data["baseline"]["speedup"] is None
    assert all(p["speedup"] > 0 for p in data["points"])


def measured_away(data: dict[str, Any]) -> dict[str, Any]:
    """A sweep's JSON without what differs between two runs: timings, speed-ups, free ports."""
    points = []
    for point in [data["baseline"], *data["points"]]:
        argv = list(point["argv"])
        argv[argv.index("--port") + 1] = "PORT"
        points.append(
            {
                "acceptance": point["acceptance"],
                "mean_length": point["mean_length"],
                "server": (point["server_n_max"], point["server_mean_length"]),
                "decode_tok_s": sorted(point["decode_tok_s"]),
                "argv": argv,
            }
        )
    kept = ("format", "benchmark_only", "instance", "spec_type", "n_max", "n_max_source", "notes")
    return {**{key: data[key] for key in kept}, "points": points}


@pytest.mark.server
def test_both_spellings_run_the_same_sweep(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.toml", llama_server_bin, synth_models.target)
    options = ("--prompts", "builtin:fibonacci", *SWEEP_OPTIONS, "--json")
    new = sweep(config, "tiny", "0.9", *options)
    old = bench(
        "--config", str(config), "--instance", "tiny", "--synthetic-acceptance", "0.9", *options
    )
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert old.stderr.splitlines()[0] == DEPRECATION
    # What it said of the servers it started, but for their free ports.
    said = [re.sub(r":\d+", ":PORT", r.stderr) for r in (old, new)]
    assert said[0].splitlines()[1:] == said[1].splitlines()
    assert "deprecated" not in new.stderr
    new_data, old_data = json.loads(new.stdout), json.loads(old.stdout)
    assert measured_away(old_data) == measured_away(new_data)
    assert [p["acceptance"] for p in new_data["points"]] == [0.9]


# --- refusals -------------------------------------------------------------------------------


def one_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([], "RATES"),
        (["0.5"], "--config"),
        (["0.5", "--config", "{config}"], "--instance"),
        (["0.5", "--instance", "tiny"], "--config"),
        (["{sweep}", "0.3,1.5"], "RATES"),
        (["{sweep}", "--", "-0.1"], "RATES"),
        (["{sweep}", "fast"], "RATES"),
        (["{sweep}", "0.5", "--runs", "0"], "--runs"),
        (["{sweep}", "0.5", "--concurrency", "0"], "--concurrency"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], option: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf")
    argv: list[str] = []
    for a in args:
        if a == "{sweep}":
            argv += ["--config", str(config), "--instance", "tiny"]
        else:
            argv.append(a.replace("{config}", str(config)))
    out = tmp_path / "r.json"
    line = one_line(bench("synthetic", "-o", str(out), *argv))
    assert line.startswith(f"llamanix bench synthetic: {option}: "), line
    assert not out.exists()


@pytest.mark.parametrize("command", [["bench"], ["bench", "run"]])
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--synthetic-acceptance", "0.5"], "--config"),
        (["--synthetic-acceptance", "0.5", "--config", "{config}"], "--instance"),
        (["{sweep}", "0.5", "--url", "http://127.0.0.1:9"], "--url"),
        (["{sweep}", "0.5", "--gpu", "rtx3090"], "--gpu"),
        (["{sweep}", "0.5", "--csv", "{tmp}/r.csv"], "--csv"),
        (["{sweep}", "0.3,1.5"], "RATES"),
        (["{sweep}", "fast"], "RATES"),
        (["{sweep}", "0.5", "--runs", "0"], "--runs"),
    ],
)
def test_the_old_spelling_says_so_then_refuses_alike(
    command: list[str], args: list[str], option: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf")
    sweep = ["--config", str(config), "--instance", "tiny", "--synthetic-acceptance"]
    argv: list[str] = []
    for a in args:
        if a == "{sweep}":
            argv += sweep
        else:
            argv.append(a.replace("{config}", str(config)).replace("{tmp}", str(tmp_path)))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, [*command, *argv, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    note, line = result.stderr.strip().splitlines()
    assert note == DEPRECATION
    assert f": {option}: " in line, line
    assert not out.exists() and not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("command", [["bench"], ["bench", "run"]])
@pytest.mark.parametrize("option", ["--config", "--instance"])
def test_config_or_instance_without_a_sweep_is_refused(
    command: list[str], option: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf")
    given = {"--config": str(config), "--instance": "tiny"}
    line = one_line(CliRunner().invoke(main, [*command, option, given[option]]))
    assert line.startswith(f"llamanix bench: {option}: only taken with --synthetic-acceptance")
    assert "llamanix bench synthetic RATES" in line


def test_both_spellings_refuse_alike(tmp_path: Path) -> None:
    """The old spelling is the new command after one line: the same refusal, word for word."""
    config = write_config(tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf")
    new = sweep(config, "tiyn", "0.5")
    old = bench("--config", str(config), "--instance", "tiyn", "--synthetic-acceptance", "0.5")
    assert new.exit_code == old.exit_code == 2
    assert old.stderr.splitlines() == [DEPRECATION, *new.stderr.splitlines()]
    assert old.stdout == new.stdout == ""


def test_instance_without_speculation_is_refused(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf", spec=False
    )
    line = one_line(sweep(config, "tiny", "0.5"))
    assert line.startswith(f"{config}: instances.tiny.speculative.type: instance has no ")
    assert "llamanix bench synthetic" in line


def test_unknown_instance_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", "/nonexistent/llama-server", tmp_path / "m.gguf")
    line = one_line(sweep(config, "tiyn", "0.5"))
    assert "instances.tiyn: no such instance" in line


def test_a_build_without_synthetic_acceptance_is_refused(tmp_path: Path) -> None:
    """A build whose --help lacks --spec-synth-len: BeeLlama's recorded --help and --version."""
    binary = tmp_path / "llama-server"
    binary.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) cat "{HELP_DATA}/beellama-ba1fdce.version.txt" >&2;;\n'
        f'*) cat "{HELP_DATA}/beellama-ba1fdce.help.txt";; esac\n'
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    config = write_config(tmp_path / "c.toml", binary, tmp_path / "m.gguf")
    line = one_line(sweep(config, "tiny", "0.5"))
    assert line.startswith(f"{binary}: --spec-synth-len: this build has no synthetic ")
    assert "--spec-synth-len" in line and "it needs upstream llama.cpp" in line


@pytest.mark.server
def test_model_missing_here_is_refused(llama_server_bin: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", llama_server_bin, tmp_path / "absent.gguf")
    line = one_line(sweep(config, "tiny", "0.5"))
    assert line.startswith(f"{config}: instances.tiny.model: {tmp_path / 'absent.gguf'} is not")
