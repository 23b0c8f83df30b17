"""Warm switch on the real model: a server's prompt cache survives its restart.

``llamanix up`` runs Gemma 3 270M (one slot, ``--swa-full``: its sliding-window cache is reused
after a restore only then) with ``warm_switch = true``. A first turn fills the slot; the same
follow-up is asked before and after a switch that keeps the cache's shape: after the warm
switch the server restores the slot (the switch reports its token count) and the follow-up
reuses it (``timings.cache_n``) and continues exactly as it did without a switch (temperature
0). A switch that changes the context size is cold, and says why. The mechanics under it
(``hosts.warm``) are checked against real servers of the tiny model: a file that is gone and
a file that holds fewer tokens than were saved are reported, never taken for a restore.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import run_llamanix, server_argv
from conftest import ServerFactory
from recorded_help import B8770, BEE03, IK_NEW, IK_PIN, UPSTREAM, recorded

from llamanix.bench.prompts import load_prompts
from llamanix.config.argv import SLOT_SAVE_FLAG
from llamanix.config.model import load_config
from llamanix.core.errors import UserError
from llamanix.hosts.warm import WarmCaches, WarmPlan, cold_reason, model_reason, plan_for
from llamanix.render.units import render_host
from llamanix.server.drain import Endpoint
from llamanix.server.server_process import free_port
from llamanix.testbed.up_process import instance_status, running_up

INSTANCE = "chat"


def first_turn() -> str:
    """About 700 tokens of real text: past the model's 512-token sliding window."""
    prompts = load_prompts("realtext")
    return "\n\n".join(p.text for p in prompts[:2] if isinstance(p.text, str))


def config_text(model: Path, binary: Path, port: int, *, warm: bool = True) -> str:
    return (
        # A binary for each variant the tests switch to: a variant without one is refused.
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{binary}", ik = "{binary}", '
        f'beellama = "{binary}", nixpkgs = "{binary}" }}\n\n'
        f"[instances.{INSTANCE}]\n"
        f'model = "{model}"\nport = {port}\ncontext = 2048\nparallel = 1\nthreads = 2\n'
        f'warm_switch = {"true" if warm else "false"}\nextra_args = ["--swa-full"]\n'
    )


llamanix = partial(run_llamanix, timeout=600)


def complete(url: str, prompt: str, n: int = 24) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": True}
    resp = httpx.post(f"{url}/completion", json=body, timeout=600)
    assert resp.status_code == 200, resp.text[:300]
    data: dict[str, Any] = resp.json()
    return data


@pytest.fixture
def deploy(tmp_path: Path, real_model: Path, llama_server_bin: Path) -> Iterator[Path]:
    port = free_port()
    (tmp_path / "llamanix.toml").write_text(config_text(real_model, llama_server_bin, port))
    with running_up(tmp_path / "llamanix.toml", "dev", INSTANCE, deadline_s=180):
        yield tmp_path


@pytest.mark.server
def test_a_warm_switch_restores_the_cache_on_the_real_model(deploy: Path) -> None:
    units = deploy / ".llamanix-state" / "dev" / "up"
    entry = instance_status(units, INSTANCE)
    assert entry is not None and entry.url is not None
    url = entry.url

    prompt = first_turn()
    answer = complete(url, prompt)["content"]
    follow_up = prompt + answer + "\n\nIn one sentence, what was the first text about?\n"
    unswitched = complete(url, follow_up)
    # The slot back to the first turn (its prefix is cached; the answer is the same at
    # temperature 0): what the switch is to keep.
    again = complete(url, prompt)
    assert again["content"] == answer
    held = again["tokens_cached"]

    switched = llamanix(
        "switch", "llamanix.toml", "--host", "dev", "--manager", "up",
        "--set", f"instances.{INSTANCE}.threads=1", "--json", cwd=deploy,
    )  # fmt: skip
    assert switched.returncode == 0, switched.stderr[-3000:]
    (row,) = json.loads(switched.stdout)
    warm = row["warm"][INSTANCE]
    assert warm["cold"] is None, warm
    (slot,) = warm["slots"]
    assert slot["outcome"] == "restored", slot
    assert slot["restored"] == slot["tokens"] == held, (slot, held)
    assert f"{INSTANCE}: warm: slot 0 restored ({held} tokens" in switched.stderr
    # The files are gone once restored.
    assert list((units / "state" / f"llamanix-{INSTANCE}").glob("llamanix-warm-*")) == []

    after = complete(url, follow_up)
    # The restored cache served the follow-up: only the new tokens were processed.
    assert after["timings"]["cache_n"] >= held - 1, after["timings"]
    assert after["timings"]["prompt_n"] < 64, after["timings"]
    # Lossless: the same continuation as without a switch.
    assert after["content"] == unswitched["content"]

    # A switch that changes the context layout cannot keep the cache: it is cold, and says why.
    cold = llamanix(
        "switch", "llamanix.toml", "--host", "dev", "--manager", "up",
        "--set", f"instances.{INSTANCE}.context=4096", "--json", cwd=deploy,
    )  # fmt: skip
    assert cold.returncode == 0, cold.stderr[-3000:]
    (row,) = json.loads(cold.stdout)
    reason = "the context layout's context changes (2048 -> 4096)"
    assert row["warm"][INSTANCE] == {"cold": reason, "slots": []}
    assert f"{INSTANCE}: cold: {reason}" in cold.stderr


@pytest.mark.server
def test_the_cold_reasons(real_model: Path, llama_server_bin: Path, tmp_path: Path) -> None:
    """Why a switch is cold, from the two configs (and the model's header)."""
    text = config_text(real_model, llama_server_bin, 8080)
    (tmp_path / "a.toml").write_text(text)
    old = load_config(tmp_path / "a.toml").instances[INSTANCE]
    argv = ("llama-server", "--slot-save-path", "%S/llamanix-chat")

    def reason(change: str, old_argv: tuple[str, ...] = argv) -> str | None:
        (tmp_path / "b.toml").write_text(text + change)
        new = load_config(tmp_path / "b.toml").instances[INSTANCE]
        return cold_reason(old, new, old_argv, argv) or model_reason(new)[0]

    assert reason("") is None
    assert reason('cache_type_k = "q8_0"\n') == (
        "the KV-cache type (cache_type_k) changes (default -> q8_0)"
    )
    assert reason('variant = "ik"\n') == (
        "the variant changes (upstream -> ik): each writes its own files"
    )
    assert reason("", old_argv=("llama-server",)) == "the running build has no --slot-save-path"
    # Gemma 3 has a 512-token sliding window: without --swa-full a restored cache is not
    # reused (measured: the next turn processed its whole prompt again).
    without = text.replace('extra_args = ["--swa-full"]\n', "")
    (tmp_path / "c.toml").write_text(without)
    plain = load_config(tmp_path / "c.toml").instances[INSTANCE]
    assert model_reason(plain)[0] == (
        "the model uses sliding-window attention (512 tokens): a restored cache is reused "
        'only with extra_args = ["--swa-full"]'
    )
    # Turned on now: the running server has no files to give.
    (tmp_path / "d.toml").write_text(config_text(real_model, llama_server_bin, 8080, warm=False))
    off = load_config(tmp_path / "d.toml").instances[INSTANCE]
    plan = plan_for(INSTANCE, off, old, argv, argv, tmp_path, 1 << 30)
    assert plan is not None and plan.cold == (
        "the running server was started without warm_switch (the next switch is warm)"
    )


def _slot_server(
    server_factory: ServerFactory, llama_server_bin: Path, synth_models: Any, slots: Path
) -> Endpoint:
    """A real server of the tiny model whose slots are saved to and restored from ``slots``."""
    argv = server_argv(
        llama_server_bin,
        synth_models.target,
        "--slot-save-path",
        str(slots),
        ctx=512,
        parallel=1,
        threads=1,
    )
    return Endpoint(server_factory(argv).url)


@pytest.mark.server
def test_a_restore_that_did_not_bring_the_cache_back_is_reported(
    server_factory: ServerFactory, llama_server_bin: Path, synth_models: Any, tmp_path: Path
) -> None:
    """Two real servers of the tiny model share a slot-save directory: what the first saved,
    the second restores; a file that is gone and a file holding fewer tokens than were saved
    are reported as such."""
    slots = tmp_path / "slots"
    slots.mkdir()
    old, new = [_slot_server(server_factory, llama_server_bin, synth_models, slots) for _ in (1, 2)]
    plan = WarmPlan(INSTANCE, None, slots, bytes_per_token=4096.0, limit_bytes=1 << 30)

    def fill(words: int) -> None:
        body = {"prompt": " ".join(["hello"] * words), "n_predict": 4, "temperature": 0}
        assert httpx.post(f"{old.url}/completion", json=body, timeout=120).status_code == 200

    # Saved and restored whole.
    fill(40)
    caches = WarmCaches({INSTANCE: plan})
    caches.save(INSTANCE, old)
    record = caches.restore(INSTANCE, new)
    assert record is not None
    (slot,) = record.slots
    assert slot.outcome == "restored" and slot.restored == slot.tokens > 40
    assert list(slots.iterdir()) == []

    # The file is gone before the restore: not restored, with the server's reason.
    caches = WarmCaches({INSTANCE: plan})
    caches.save(INSTANCE, old)
    (slots / "llamanix-warm-0.bin").unlink()
    record = caches.restore(INSTANCE, new)
    assert record is not None and record.slots[0].outcome == "not restored"
    assert "HTTP 400" in (record.slots[0].why or "")

    # The file holds fewer tokens than the slot had when saved: the restore's own count says
    # so, and the slot is not counted as restored.
    caches = WarmCaches({INSTANCE: plan})
    caches.save(INSTANCE, old)
    saved = (slots / "llamanix-warm-0.bin").read_bytes()
    fill(8)
    small = httpx.post(
        f"{old.url}/slots/0?action=save", json={"filename": "small.bin"}, timeout=60
    ).json()
    (slots / "small.bin").replace(slots / "llamanix-warm-0.bin")
    record = caches.restore(INSTANCE, new)
    assert record is not None
    (slot,) = record.slots
    assert slot.outcome == "restore incomplete", slot
    assert slot.restored == small["n_saved"] < slot.tokens
    assert len(saved) > 0 and list(slots.iterdir()) == []


@pytest.mark.parametrize("recording", [UPSTREAM, IK_PIN, IK_NEW, BEE03, B8770])
def test_every_recorded_dialect_takes_the_slot_save_path(recording: str, tmp_path: Path) -> None:
    """The probe of each recorded build lists --slot-save-path, so its unit gets the flag
    (the state directory, a systemd specifier left for systemd to expand)."""
    caps = recorded(recording)
    assert SLOT_SAVE_FLAG in caps.flags
    variant = {UPSTREAM: "upstream", IK_PIN: "ik", IK_NEW: "ik", BEE03: "beellama"}
    (tmp_path / "l.toml").write_text(
        config_text(Path("/srv/m.gguf"), Path("/opt/llama-server"), 8080).replace(
            'extra_args = ["--swa-full"]\n', f'variant = "{variant.get(recording, "nixpkgs")}"\n'
        )
    )
    config = load_config(tmp_path / "l.toml")
    render = render_host(config, "dev", {"*": caps})
    (inst,) = render.instances
    assert inst.argv[inst.argv.index(SLOT_SAVE_FLAG) + 1] == "%S/llamanix-chat"
    start = next(line for line in inst.unit_text.splitlines() if line.startswith("ExecStart="))
    assert f"{SLOT_SAVE_FLAG} %S/llamanix-chat" in start
    assert inst.warnings == ()


def test_a_build_without_the_slot_api_renders_without_it_and_says_so(tmp_path: Path) -> None:
    caps = recorded(UPSTREAM)
    caps = replace(caps, flags=[f for f in caps.flags if f != SLOT_SAVE_FLAG])
    (tmp_path / "l.toml").write_text(
        config_text(Path("/srv/m.gguf"), Path("/opt/llama-server"), 8080)
    )
    render = render_host(load_config(tmp_path / "l.toml"), "dev", {"*": caps})
    (inst,) = render.instances
    assert SLOT_SAVE_FLAG not in inst.argv
    assert inst.warnings == (
        "instances.chat.warm_switch: /opt/llama-server has no --slot-save-path, so its "
        "switches are cold",
    )


def test_a_routers_member_cannot_ask_for_a_warm_switch(tmp_path: Path) -> None:
    text = config_text(Path("/srv/m.gguf"), Path("/opt/llama-server"), 8080)
    text = text.replace(
        "\n\n[instances.chat]",
        '\n[hosts.dev.router]\nkind = "llama-server"\nmembers = ["chat"]\nport = 9090\n'
        "\n[instances.chat]",
    )
    (tmp_path / "l.toml").write_text(text)
    with pytest.raises(UserError) as err:
        load_config(tmp_path / "l.toml")
    assert "instances.chat.warm_switch: a router's member cannot keep its caches" in str(err.value)


@pytest.mark.server
def test_a_slot_file_from_another_build_is_refused(
    server_factory: ServerFactory, llama_server_bin: Path, synth_models: Any, tmp_path: Path
) -> None:
    """Each saved file is stamped with the build that wrote it (``/props``' build_info) and
    the context layout; a restore into a server of another build, or of another layout, is
    refused before the server reads a byte of it, and the switch is cold saying why."""
    slots = tmp_path / "slots"
    slots.mkdir()
    old, new = [_slot_server(server_factory, llama_server_bin, synth_models, slots) for _ in (1, 2)]
    build = httpx.get(f"{new.url}/props", timeout=30).json()["build_info"]
    layout = {"model": str(synth_models.target), "context": 512, "parallel": 1}
    plan = WarmPlan(INSTANCE, None, slots, 4096.0, 1 << 30, layout)
    body = {"prompt": " ".join(["hello"] * 40), "n_predict": 4, "temperature": 0}
    assert httpx.post(f"{old.url}/completion", json=body, timeout=120).status_code == 200

    caches = WarmCaches({INSTANCE: plan})
    caches.save(INSTANCE, old)
    stamp = json.loads((slots / "llamanix-warm-0.json").read_text())
    assert stamp == {"build": build, "layout": layout}
    # The same file, as a build before a pin move would have written it.
    (slots / "llamanix-warm-0.json").write_text(json.dumps({**stamp, "build": "b11428-0aaaaaa"}))
    record = caches.restore(INSTANCE, new)
    assert record is not None and record.slots == ()
    assert record.cold == (
        f"the slot file is from build b11428-0aaaaaa, the server runs {build}: each build reads "
        "only its own files"
    )
    assert list(slots.iterdir()) == []
    # Nothing reached the new server's slot.
    (slot,) = httpx.get(f"{new.url}/slots", timeout=30).json()
    assert "n_prompt_tokens" not in slot

    # Another layout is refused the same way.
    caches = WarmCaches({INSTANCE: plan})
    caches.save(INSTANCE, old)
    other = WarmPlan(INSTANCE, None, slots, 4096.0, 1 << 30, {**layout, "context": 1024})
    record = WarmCaches({INSTANCE: other}, caches.pending).restore(INSTANCE, new)
    assert record is not None
    assert record.cold == "the context layout's context changes (512 -> 1024)"
