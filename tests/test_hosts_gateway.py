"""The gateway under a real systemd (PID 1) on Debian 12: `llamanix switch` installs LiteLLM
1.106.12 into its venv through the host's own pip configuration (here: no index, a directory of
wheels), starts the hardened llamanix-gateway.service in front of a llama-server on the same
host, and a chat completion answers through it with the key from the file, while neither key
is in the unit, any argv or the journal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import HOST_FIGURES, REPO
from hostbed import CONFIG, KEY_FILE, SERVER, llamanix, new_key, output, reset

from llamanix.core.schema import LITELLM_VERSION
from llamanix.hosts.gateway_venv import MARKER
from llamanix.render.gateway import VENV_ROOT
from llamanix.testbed import hosts
from llamanix.testbed.gateway_wheels import litellm_wheels, offer_wheels
from llamanix.testbed.hosts import Host

pytestmark = [pytest.mark.server, pytest.mark.hosts]

UNIT = "llamanix-gateway.service"
GATEWAY_KEY = "/etc/llamanix/gateway.key"
PORT = 4000
REPLICA_PORT = 8190
TINY = f"{hosts.MODELS}/tiny.gguf"


@pytest.fixture(autouse=True)
def clean(host: Host) -> Iterator[None]:
    yield
    reset(host)


def gateway_config() -> str:
    return (
        f'[hosts.box]\nkind = "systemd"\nbinaries = {{ upstream = "{SERVER}" }}\n\n'
        f'[gateway]\nkind = "litellm"\nhost = "box"\nport = {PORT}\n'
        f'api_key_file = "{GATEWAY_KEY}"\n\n'
        f'[instances.chat]\nvariant = "upstream"\nmodel = "{TINY}"\nalias = "tiny"\n'
        f'port = {REPLICA_PORT}\ncontext = 1024\nparallel = 1\napi_key_file = "{KEY_FILE}"\n'
    )


_ASK = """
import sys, httpx
port, model = sys.argv[1], sys.argv[2]
key = sys.stdin.read().strip()
headers = {"Authorization": f"Bearer {key}"} if key else {}
body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
try:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers,
                   timeout=120)
    print(r.status_code)
except httpx.HTTPError as err:
    print(type(err).__name__)
"""


def ask(host: Host, key: str | None) -> str:
    """A chat for the group through the gateway; the key travels on stdin, never in argv."""
    done = host.run(
        [f"{hosts.VENV}/bin/python", "-c", _ASK, str(PORT), "tiny"],
        input_text=key or "",
        check=False,
    )
    return done.stdout.strip() or done.stderr.strip()[-300:]


def _monotonic_s(host: Host, prop: str) -> float:
    done = host.run(["systemctl", "show", UNIT, "-p", prop, "--value"], check=True)
    return int(done.stdout.strip() or 0) / 1e6


@pytest.mark.parametrize("host", ["debian12"], indirect=True)
def test_gateway_serves_a_chat_with_the_key_from_its_file(host: Host) -> None:
    # What a user behind a mirror does, with a directory of wheels for the mirror.
    offer_wheels(host, litellm_wheels(hosts.SPECS["debian12"].python))
    # Every installed Debian has it (the installer writes it); the bed's minimal root file
    # system does not. LiteLLM resolves "localhost" at start when its port is 4000.
    host.write("/etc/hosts", "127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
    gateway_key, replica_key = new_key(), new_key()
    host.write(CONFIG, gateway_config(), mode=0o644)
    host.write(GATEWAY_KEY, gateway_key + "\n", mode=0o600)
    host.write(KEY_FILE, replica_key + "\n", mode=0o600)

    started = time.monotonic()
    done = llamanix(host, "switch", CONFIG)
    switch_s = time.monotonic() - started
    assert done.returncode == 0, output(done)[-2000:] + "\n" + host.journal(UNIT)[-4000:]
    venv = host.path(f"{VENV_ROOT}/{LITELLM_VERSION}")
    install_s = (venv / MARKER).stat().st_mtime - (venv / "pyvenv.cfg").stat().st_mtime
    state = host.run(["systemctl", "is-active", UNIT], check=False).stdout.strip()
    assert state == "active", host.journal(UNIT)[-3000:]
    start_s = _monotonic_s(host, "ActiveEnterTimestampMonotonic") - _monotonic_s(
        host, "ExecMainStartTimestampMonotonic"
    )

    assert ask(host, gateway_key) == "200"
    assert ask(host, None) != "200"
    assert ask(host, replica_key) != "200"  # the replica's key is not the gateway's

    unit_text = host.run(["systemctl", "cat", UNIT], check=True).stdout
    argv = host.run(["ps", "-eo", "args"], check=True).stdout
    journal = host.run(["journalctl", "--no-pager", "-o", "cat", "-b"], check=False).stdout
    for key in (gateway_key, replica_key):
        assert key not in unit_text
        assert key not in argv
        assert key not in journal
    assert "litellm --config" in argv  # the process that was looked at is there

    # What `validate` checks the render against is what this very LiteLLM accepts: the script
    # that recorded it, run again with the venv the switch made, writes the same file.
    script = "/root/litellm-accepted-keys"
    host.write(script, (REPO / "scripts/litellm-accepted-keys").read_text(), mode=0o755)
    venv_python = f"{VENV_ROOT}/{LITELLM_VERSION}/bin/python"
    keys = host.run([venv_python, script], check=True, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    recorded = REPO / f"tools/llamanix/data/litellm-{LITELLM_VERSION}.json"
    assert keys.stdout == recorded.read_text()
    HOST_FIGURES.append(
        f"debian12 gateway: LiteLLM {LITELLM_VERSION} installed offline in {install_s:.1f}s "
        f"(switch {switch_s:.1f}s), llamanix-gateway.service started in {start_s:.1f}s"
    )
