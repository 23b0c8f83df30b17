"""llamanix's upstream argv against the real upstream llama-server, with synthetic models.

Each speculative type that needs no special weights is configured the way a user would
(a config checked by parse_config, argv from instance_argv), started, asked through both
APIs, and shown to draft: ``timings.draft_n`` in the response and the ``spec_decode_*``
counters in /metrics.

The prompt for the drafting checks replays the target's own text: T, its greedy continuation
of a seed prompt, then T's first REPLAY tokens again. The synthetic target's next token
depends almost only on the current one (see llamanix.testbed.synth), so after that prompt it writes
T's next tokens once more, and every n-gram drafter finds them in the prompt.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cli_run import server_argv
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from llamanix.cli import main
from llamanix.config.argv import instance_argv
from llamanix.config.model import Config, parse_config
from llamanix.server.server_process import LlamaServer, free_port

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels

pytestmark = pytest.mark.server

SEED_PROMPT = "the quick brown fox jumps over the lazy dog"
# Every speculative type upstream runs without special weights (draft-mtp, -eagle3, -dflash
# and -dspark need heads trained for them), and a chain: a drafter beside an n-gram type, with
# the drafter's own cache types and device.
SPEC_TYPES = (
    "none",
    "draft",
    "ngram-simple",
    "ngram-mod",
    "ngram-cache",
    "ngram-map-k",
    "ngram-map-k4v",
    "draft+ngram-mod",
)
SPEC_COUNTERS = (
    "llamacpp:spec_decode_num_drafts_total",
    "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total",
)


def make_config(binary: Path, model: Path, speculative: dict[str, Any], source: Path) -> Config:
    data = {
        "instances": {
            "t": {
                "binary": str(binary),
                "model": str(model),
                "port": free_port(),
                "context": 2048,
                "parallel": 1,
                "threads": 2,
                "metrics": True,
                "speculative": speculative,
            }
        }
    }
    return parse_config(data, str(source))


def speculative_table(spec_type: str, model: Path) -> dict[str, Any]:
    if spec_type == "draft":
        # draft = target: a confident model agrees with itself, so p_min 0.6 keeps drafting.
        return {"type": "draft", "draft_model": str(model), "n_max": 8, "p_min": 0.6}
    if spec_type == "draft+ngram-mod":
        return {
            "type": ["draft", "ngram-mod"],
            "draft_model": str(model),
            "n_max": 8,
            "p_min": 0.6,
            "draft_cache_type_k": "f16",
            "draft_cache_type_v": "f16",
            "draft_device": "none",
        }
    return {"type": spec_type}


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {
        sample.name: float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def complete(base_url: str, prompt: str | list[int], n_predict: int) -> dict[str, Any]:
    reply = httpx.post(
        f"{base_url}/completion",
        json={"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def chat(base_url: str) -> dict[str, Any]:
    reply = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": SEED_PROMPT}],
            "max_tokens": 16,
            "temperature": 0,
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


# Longer than the longest n-gram lookup (ngram-mod matches 24 tokens).
REPLAY = 32


@pytest.fixture(scope="module")
def replay_prompt(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path_factory: pytest.TempPathFactory
) -> list[int]:
    """T + T[:REPLAY] as token ids, T the target's greedy continuation of SEED_PROMPT."""
    log = tmp_path_factory.mktemp("replay") / "server.log"
    argv = server_argv(llama_server_bin, synth_models.target, ctx=2048, parallel=1, threads=2)
    with LlamaServer(argv, log) as server:
        text: list[int] = complete(server.url, SEED_PROMPT, 160)["tokens"]
        prompt = text + text[:REPLAY]
        # The premise of the drafting checks: after the prompt, the model writes T again.
        replayed = complete(server.url, prompt, 8)["tokens"]
    assert replayed == text[REPLAY : REPLAY + 8], "the synthetic target did not replay its text"
    return prompt


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_speculative_type_starts_serves_and_drafts(
    spec_type: str,
    llama_server_bin: Path,
    synth_models: SynthModels,
    replay_prompt: list[int],
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    model = synth_models.target
    cfg = make_config(
        llama_server_bin, model, speculative_table(spec_type, model), tmp_path / "llamanix.toml"
    )
    argv = instance_argv(cfg, "t", variant="upstream")
    assert argv[0] == str(llama_server_bin)
    assert ("--spec-type" in argv) == (spec_type != "none"), shlex.join(argv)
    if spec_type == "draft+ngram-mod":
        i = argv.index("--spec-type")
        assert argv[i : i + 2] == ["--spec-type", "draft-simple,ngram-mod"]
        assert shlex.join(argv).count("-ctkd f16 -ctvd f16 -devd none") == 1

    server = server_factory(argv)

    # The completion goes first: ngram-cache learns only from the first prompt it sees
    # past what it has already read (upstream keeps its position across requests).
    before = counters(server.url)
    timings = complete(server.url, replay_prompt, 64)["timings"]
    after = counters(server.url)
    delta = {name: after[name] - before.get(name, 0.0) for name in SPEC_COUNTERS}

    answer = chat(server.url)
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    assert answer["usage"]["completion_tokens"] > 0

    if spec_type == "none":
        assert timings.get("draft_n", 0) == 0
        assert all(v == 0 for v in delta.values()), delta
        return
    assert timings["draft_n"] > 0, f"{spec_type} did not draft: {timings}"
    assert timings["draft_n_accepted"] > 0, timings
    assert delta["llamacpp:spec_decode_num_drafts_total"] > 0, delta
    assert delta["llamacpp:spec_decode_num_draft_tokens_total"] == timings["draft_n"], delta
    assert delta["llamacpp:spec_decode_num_accepted_tokens_total"] == timings["draft_n_accepted"], (
        delta
    )
    if spec_type == "draft":
        # The draft is the target itself: every drafted token is the one the target picks.
        assert timings["draft_n_accepted"] == timings["draft_n"]
    assert "draft acceptance" in server.log_text()


def test_unsure_model_never_drafts_with_p_min(
    llama_server_bin: Path,
    synth_models: SynthModels,
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    """Why synth-model's output scale defaults to 1.0: at 0.02 no token clears p_min 0.6."""
    model = synth_models.unsure_target
    cfg = make_config(
        llama_server_bin, model, speculative_table("draft", model), tmp_path / "llamanix.toml"
    )
    server = server_factory(instance_argv(cfg, "t", variant="upstream"))
    timings = complete(server.url, SEED_PROMPT, 32)["timings"]
    assert timings.get("draft_n", 0) == 0
    assert counters(server.url)["llamacpp:spec_decode_num_draft_tokens_total"] == 0


def test_unrelated_draft_drafts_but_is_mostly_rejected(
    llama_server_bin: Path,
    synth_models: SynthModels,
    replay_prompt: list[int],
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    spec = {"type": "draft", "draft_model": str(synth_models.unrelated_draft), "n_max": 8}
    cfg = make_config(llama_server_bin, synth_models.target, spec, tmp_path / "llamanix.toml")
    server = server_factory(instance_argv(cfg, "t", variant="upstream"))
    timings = complete(server.url, replay_prompt, 64)["timings"]
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] < timings["draft_n"]


def test_draft_with_another_vocabulary_serves_without_speculation(
    llama_server_bin: Path,
    synth_models: SynthModels,
    replay_prompt: list[int],
    server_factory: ServerFactory,
    tmp_path: Path,
) -> None:
    """Another silent one: upstream logs an error about the draft's vocabulary, then serves
    without speculation instead of refusing to start (llamanix doctor checks the vocabs)."""
    spec = {"type": "draft", "draft_model": str(synth_models.other_vocab_draft)}
    cfg = make_config(llama_server_bin, synth_models.target, spec, tmp_path / "llamanix.toml")
    server = server_factory(instance_argv(cfg, "t", variant="upstream"))
    timings = complete(server.url, replay_prompt, 32)["timings"]
    assert timings.get("draft_n", 0) == 0
    assert "vocabs are not compatible" in server.log_text()
    assert counters(server.url)["llamacpp:spec_decode_num_draft_tokens_total"] == 0


def test_md_without_spec_type_loads_the_draft_and_never_drafts(
    llama_server_bin: Path,
    synth_models: SynthModels,
    replay_prompt: list[int],
    server_factory: ServerFactory,
) -> None:
    """The silent trap: upstream's -md alone loads a draft model and never uses it.

    llamanix never renders this (a draft model always comes with --spec-type draft-simple);
    the argv is written by hand to show what it would cost.
    """
    model = str(synth_models.target)
    server = server_factory(
        server_argv(
            llama_server_bin, model, "-md", model, "--metrics", ctx=2048, parallel=1, threads=2
        )
    )
    timings = complete(server.url, replay_prompt, 64)["timings"]
    assert "loading draft model" in server.log_text()
    assert timings.get("draft_n", 0) == 0
    assert counters(server.url)["llamacpp:spec_decode_num_draft_tokens_total"] == 0


# --- probe and validate against the real binary ---------------------------------------------


@pytest.fixture(scope="module")
def probe_json(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = CliRunner().invoke(main, ["variant", "probe", str(llama_server_bin), "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path_factory.mktemp("probe") / "upstream.json"
    path.write_text(result.output)
    return path


def test_probe_of_the_real_binary(probe_json: Path) -> None:
    caps = json.loads(probe_json.read_text())
    assert "draft-mtp" in caps["spec_types"]
    assert {"draft-simple", "ngram-mod", "ngram-cache"} <= set(caps["spec_types"])
    assert caps["commit"] == "0c1e570"
    assert "--spec-draft-p-min" in caps["flags"]
    assert "--draft-max" in caps["removed_flags"]


# Where a unit would find the model: the probe is the subject here, and validate --remote checks
# only where each path is (pytest's /tmp is hidden from units by PrivateTmp=yes).
UNIT_MODEL = Path("/srv/models/target.gguf")


def _config_file(tmp_path: Path, binary: Path, model: Path) -> Path:
    path = tmp_path / "llamanix.toml"
    path.write_text(
        '[hosts.box]\nkind = "systemd"\n\n'
        "[instances.chat]\n"
        'host = "box"\n'
        f"binary = {json.dumps(str(binary))}\n"
        f"model = {json.dumps(str(model))}\n"
        "port = 8091\n"
        "context = 4096\n"
        'flash_attn = "on"\n'
        'cache_type_k = "q8_0"\n'
        'cache_type_v = "q8_0"\n'
        "[instances.chat.speculative]\n"
        'type = "draft"\n'
        f"draft_model = {json.dumps(str(model))}\n"
        "n_max = 8\n"
        "p_min = 0.6\n"
    )
    return path


def test_config_validates_against_the_real_probe(
    probe_json: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    config = _config_file(tmp_path, llama_server_bin, UNIT_MODEL)
    result = CliRunner().invoke(
        main, ["validate", "--remote", str(config), "--capabilities", str(probe_json)]
    )
    assert result.exit_code == 0, result.output


def test_probe_without_a_needed_flag_fails_validation(
    probe_json: Path, llama_server_bin: Path, tmp_path: Path
) -> None:
    caps = json.loads(probe_json.read_text())
    caps["flags"] = [f for f in caps["flags"] if f != "--spec-draft-p-min"]
    doctored = tmp_path / "older.json"
    doctored.write_text(json.dumps(caps))
    config = _config_file(tmp_path, llama_server_bin, UNIT_MODEL)

    result = CliRunner().invoke(
        main, ["validate", "--remote", str(config), "--capabilities", str(doctored)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert lines[0].startswith(f"{config}: instances.chat.speculative.p_min: ")
    # The probe's flags decide which parameters the build takes.
    assert lines[0].endswith(
        f"{doctored} (version 0.5.0-dev, commit 0c1e570) takes no p_min (remove it)"
    )
