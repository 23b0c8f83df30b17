"""What the host tests do inside a booted host: run llamanix as its users do, talk to a
server, and look everywhere a key could leak. (The hosts themselves: llamanix.testbed.hosts.)"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from conftest import REPO

from llamanix.testbed import hosts
from llamanix.testbed.fleet import Fleet, fleet
from llamanix.testbed.hosts import Host
from llamanix.testbed.synth import SynthSpec, synth_model

CONFIG = "/etc/llamanix/llamanix.toml"
KEY_FILE = "/etc/llamanix/api-key"
UNITS = "/etc/systemd/system"
USER_CONFIG = f"/home/{hosts.USER}/llamanix/llamanix.toml"
SERVER = "/usr/local/bin/llama-server"
BROKEN = "/usr/local/bin/llama-server-broken"
TINY = f"{hosts.MODELS}/tiny.gguf"
# sudo resets PATH to its secure_path, which does not hold the venv: llamanix runs by its
# absolute path, as `sudo /opt/llamanix/bin/llamanix ...` does for a user.
SUDO = ["sudo", hosts.LLAMANIX]


def slow_script(binary: str, seconds: int) -> str:
    """``binary``, slow to start serving; its --help and --version answer at once, as a real
    server's do however long its model takes to load (the switch asks them first)."""
    return (
        f'#!/bin/sh\ncase "$1" in --help|--version) exec {binary} "$1" ;; esac\n'
        f'sleep {seconds}\nexec {binary} "$@"\n'
    )


def config_text(
    port: int,
    *,
    key: str | None = None,
    kind: str = "systemd",
    binary: str = SERVER,
    model: str = TINY,
    instance: str = "chat",
    extra: str = "",
) -> str:
    key_line = f'api_key_file = "{key}"\n' if key else ""
    return (
        f'[hosts.box]\nkind = "{kind}"\nbinaries = {{ upstream = "{binary}" }}\n\n'
        f'[instances.{instance}]\nvariant = "upstream"\nmodel = "{model}"\nport = {port}\n'
        f"context = 1024\nparallel = 1\n{key_line}{extra}"
    )


def write_config(host: Host, text: str, key: str | None = None, path: str = CONFIG) -> None:
    owner = 0 if path == CONFIG else host.uid_of(hosts.USER)
    host.write(path, text, mode=0o644, owner=owner)
    if key is not None:
        # Root's alone: systemd reads it (LoadCredential=) and hands the server a copy.
        host.write(KEY_FILE, key + "\n", mode=0o600)


def new_key() -> str:
    return "sk-" + secrets.token_hex(16)


def llamanix(
    host: Host, *args: str, user: str | None = None, check: bool = False, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    argv = [hosts.LLAMANIX, *args] if user else [*SUDO, *args]
    return host.run(argv, user=user, check=check, timeout_s=timeout_s)


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


_CHAT = """
import sys, httpx
port, key = sys.argv[1], sys.stdin.read().strip()
headers = {"Authorization": f"Bearer {key}"} if key else {}
body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
try:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers,
                   timeout=60)
    print(r.status_code)
except httpx.HTTPError as err:
    print(type(err).__name__)
"""


def chat(host: Host, port: int, key: str | None = None) -> str:
    """The status of a chat completion inside the host ("200", "401", or the error's name).
    The key travels on stdin: never in an argv."""
    done = host.run(
        [f"{hosts.VENV}/bin/python", "-c", _CHAT, str(port)], input_text=key or "", check=False
    )
    return done.stdout.strip() or done.stderr.strip()


_COMPLETE = """
import json, sys, httpx
port, prompt = sys.argv[1], sys.argv[2]
key = sys.stdin.read().strip()
headers = {"Authorization": f"Bearer {key}"} if key else {}
body = {"prompt": prompt, "n_predict": 16, "temperature": 0}
try:
    r = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, headers=headers, timeout=120)
    text = r.json().get("content", "") if r.status_code == 200 else ""
    print(json.dumps([r.status_code, text]))
except httpx.HTTPError as err:
    print(json.dumps([type(err).__name__, ""]))
"""


def complete(host: Host, port: int, prompt: str, key: str | None = None) -> tuple[str, str]:
    """A raw-text completion inside the host (a base model's endpoint): its status and text.
    The key travels on stdin: never in an argv."""
    done = host.run(
        [f"{hosts.VENV}/bin/python", "-c", _COMPLETE, str(port), prompt],
        input_text=key or "",
        check=False,
    )
    if not done.stdout.strip():
        return done.stderr.strip(), ""
    status, text = json.loads(done.stdout)
    return str(status), str(text)


def wait_chat(
    host: Host, port: int, want: str, key: str | None = None, within_s: float = 90
) -> str:
    deadline = time.monotonic() + within_s
    while True:
        got = chat(host, port, key)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(1)


_LEAKS = """
import os, sys, pathlib
key = sys.stdin.read().strip().encode()
found = []
for top in sys.argv[1:]:
    for p in pathlib.Path(top).rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and key in p.read_bytes():
                found.append(str(p))
        except OSError:
            pass
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for what in ("cmdline", "environ"):
            try:
                if key in pathlib.Path(f"/proc/{pid}/{what}").read_bytes():
                    found.append(f"/proc/{pid}/{what}")
            except OSError:
                pass
print("\\n".join(found))
"""


def key_leaks(host: Host, key: str, *places: str) -> list[str]:
    """Every file under ``places``, every process's argv and environment, and the whole journal
    that hold ``key`` (the key file itself and systemd's credential copies are its home)."""
    done = host.run([f"{hosts.VENV}/bin/python", "-c", _LEAKS, *places], input_text=key, check=True)
    found = [line for line in done.stdout.splitlines() if line and line != KEY_FILE]
    journal = host.run(["journalctl", "--no-pager", "-o", "cat", "-b"], check=False).stdout
    if key in journal:
        found.append("journal")
    return found


def show(host: Host, unit: str, *props: str, user: str | None = None) -> dict[str, str]:
    argv = ["systemctl", *(["--user"] if user else []), "show", unit]
    argv += ["-p", ",".join(props)]
    text = host.run(argv, user=user, check=True).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def exposure(host: Host, unit: str, *, user: str | None = None, offline: bool = False) -> float:
    """systemd-analyze security's overall figure for ``unit`` (running, or its file offline)."""
    argv = ["systemd-analyze", *(["--user"] if user else []), "security", "--no-pager"]
    argv += ["--offline=yes", unit] if offline else [unit]
    done = host.run(argv, user=user, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout + done.stderr)
    assert m, f"no exposure figure in: {(done.stdout + done.stderr)[-400:]}"
    return float(m.group(1))


def generations(
    host: Host, config: str = CONFIG, user: str | None = None
) -> list[dict[str, object]]:
    done = llamanix(host, "generations", config, "--json", user=user, check=True)
    data = json.loads(done.stdout)
    assert isinstance(data, list)
    return data


def reset(host: Host) -> None:
    """Remove what a test installed: every llamanix unit (system and the user's), configs, state."""
    script = f"""
for u in $(systemctl list-units --all --plain --no-legend 'llamanix-*' | awk '{{print $1}}'); do
  systemctl disable --now "$u" || true
done
rm -f {UNITS}/llamanix-*.service {UNITS}/multi-user.target.wants/llamanix-*.service
systemctl daemon-reload
systemctl reset-failed
rm -rf /etc/llamanix
"""
    host.sh(script, check=False)
    user_script = """
units=$(systemctl --user list-units --all --plain --no-legend 'llamanix-*' | awk '{print $1}')
for u in $units; do
  systemctl --user disable --now "$u" || true
done
rm -rf ~/.config/systemd/user/llamanix-* ~/.config/systemd/user/default.target.wants/llamanix-*
systemctl --user daemon-reload
systemctl --user reset-failed
rm -rf ~/llamanix
"""
    host.run(["sh", "-c", user_script], user=hosts.USER, check=False)


@contextlib.contextmanager
def tiny_fleet(
    names: Sequence[hosts.HostName], work: Path, project_wheel: Path, binary: Path
) -> Iterator[tuple[Fleet, float]]:
    """A fleet of ``names`` with this checkout's llamanix, ``binary`` and a tiny model
    (hosts.MODELS/tiny.gguf) on every host; yields it and the seconds it took to come up."""
    model = synth_model(SynthSpec(seed=1), work / "tiny.gguf")
    requirements = hosts.requirements_of(REPO)
    dependencies = {
        hosts.SPECS[n].python: hosts.dependency_wheels(hosts.SPECS[n].python, requirements)
        for n in names
    }
    started = time.monotonic()
    with fleet(
        names,
        work,
        project_wheel=project_wheel,
        dependencies=dependencies,
        binary=binary,
        models=[model],
    ) as up:
        yield up, time.monotonic() - started
