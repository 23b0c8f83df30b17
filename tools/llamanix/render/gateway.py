"""The gateway: LiteLLM's proxy in front of the instances of every host (``[gateway]``).

Every instance is a replica in the model group named by its alias (else its name); LiteLLM
spreads a group's requests over its replicas, retries a failed one on another and, from its
background health checks, routes around a replica that is down. Here: the LiteLLM config
(``litellm.yaml``), the check of its keys against what the pinned LiteLLM accepts, and the
hardened unit that runs it on a Debian host. docs/gateway.md has the defaults and why.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from llamanix.core.address import connect_url, remote_host, url_host
from llamanix.core.api_key import key_env
from llamanix.core.config import Config, Gateway, Instance
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.render import formats, systemd
from llamanix.render.manifest import RenderedInstance, unit_name
from llamanix.render.unit_templates import unit_template

CONFIG_FILE = "litellm.yaml"
UNIT_NAME = "gateway"
MASTER_KEY_CREDENTIAL = "master-key"
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
# Where a Debian host keeps each LiteLLM release's own venv (deploy.gateway_venv makes it).
VENV_ROOT = "/var/lib/llamanix/litellm"
# What each deployment's health check asks for: one token is enough to know it serves.
HEALTH_CHECK_MAX_TOKENS = 1
# Seconds LiteLLM waits for one request: a long generation on a big model takes minutes.
REQUEST_TIMEOUT_S = 600


@dataclass(frozen=True)
class Deployment:
    """One replica of a model group, as LiteLLM reaches it."""

    group: str  # the model name clients ask for: the alias, else the instance name
    instance: str
    api_base: str
    key_env: str | None  # the variable the gateway's unit fills from the replica's key file
    key_file: str | None


def gateway_of(config: Config) -> Gateway:
    if config.gateway is None:
        raise UserError(
            Problem(config.source, "gateway", "this config has no gateway", "add a [gateway]")
        )
    return config.gateway


def _served(config: Config, inst: Instance) -> tuple[str, int, str | None]:
    """(listen, port, key file) a replica is served at: its own, or its router's."""
    router = config.hosts[inst.host].router
    if router is not None and inst.name in router.members:
        return router.listen, router.port, router.api_key_file
    return inst.listen, inst.port, inst.api_key_file


def deployments(config: Config) -> list[Deployment]:
    """Every instance of every host as a replica, by instance name: the order in which Nix
    reads a TOML table, so the NixOS module (nix/lib.nix) renders the same list."""
    gateway = gateway_of(config)
    out: list[Deployment] = []
    for inst in sorted(config.instances.values(), key=lambda i: i.name):
        host = config.hosts[inst.host]
        listen, port, key_file = _served(config, inst)
        if inst.host == gateway.host:
            # On the gateway's own host a wildcard listener answers on loopback.
            address = remote_host(listen, "127.0.0.1", inst.host)
        else:
            address = remote_host(listen, host.target, inst.host)
        out.append(
            Deployment(
                group=inst.alias or inst.name,
                instance=inst.name,
                api_base=f"http://{url_host(address)}:{port}/v1",
                key_env=key_env(inst.name) if key_file else None,
                key_file=key_file,
            )
        )
    return out


def settings(config: Config) -> JsonObject:
    """LiteLLM's config: the model list and the settings measured to keep clients served
    while replicas go down in turn (docs/gateway.md)."""
    gateway = gateway_of(config)
    model_list: list[JsonValue] = []
    for d in deployments(config):
        model_list.append(
            {
                "model_name": d.group,
                "litellm_params": {
                    "model": f"openai/{d.group}",
                    "api_base": d.api_base,
                    # LiteLLM's OpenAI client needs a string even where the server takes none.
                    "api_key": f"os.environ/{d.key_env}" if d.key_env else "none",
                },
                "model_info": {"health_check_max_tokens": HEALTH_CHECK_MAX_TOKENS},
            }
        )
    return {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": gateway.routing_strategy,
            "num_retries": gateway.retries,
            # Retry on another replica at once: a replica that is down stays down for seconds.
            "retry_after": 0,
            # Read by litellm.Router, not by general_settings, in 1.106.12.
            "enable_health_check_routing": True,
            # A replica fenced for its restart fails every request sent to it for a second or
            # two; past half of a minute's requests LiteLLM would cool it down for 5 s, and a
            # rolling switch then fences the other one while the first is still cooling:
            # every request failed (measured: 132 in 5 s). The health checks and the per-request
            # failover already route around a replica that is down.
            "disable_cooldowns": True,
        },
        "general_settings": {
            "master_key": f"os.environ/{MASTER_KEY_ENV}",
            "background_health_checks": True,
            "health_check_interval": gateway.health_check_interval,
        },
        "litellm_settings": {"request_timeout": REQUEST_TIMEOUT_S},
    }


def config_text(config: Config) -> str:
    """litellm.yaml: JSON, which YAML reads as is (no YAML library needed to write it)."""
    header = formats.comment_lines(
        "#", [f"Generated by llamanix: the gateway of {config.source.rsplit('/', 1)[-1]}."]
    )
    return "\n".join(header) + "\n" + formats.json_text(settings(config))


# --- what the LiteLLM version accepts ----------------------------------------------------------

SECTIONS = ("router_settings", "general_settings", "litellm_settings")


def accepted_keys(version: str) -> dict[str, frozenset[str]] | None:
    """The keys LiteLLM ``version`` accepts in each section (recorded by
    scripts/litellm-accepted-keys), or None when no record of that version is shipped."""
    path = resources.files("llamanix").joinpath(f"data/litellm-{version}.json")
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {k: frozenset(v) for k, v in data.items() if isinstance(v, list)}


def used_keys(rendered: JsonObject) -> dict[str, set[str]]:
    """The keys a rendered config uses in each section, deployments' keys included."""
    out: dict[str, set[str]] = {"litellm_params": set(), "model_info": set()}
    for section in SECTIONS:
        value = rendered.get(section)
        out[section] = set(value) if isinstance(value, dict) else set()
    models = rendered.get("model_list")
    for entry in models if isinstance(models, list) else []:
        if not isinstance(entry, dict):
            continue
        for section in ("litellm_params", "model_info"):
            value = entry.get(section)
            if isinstance(value, dict):
                out[section] |= set(value)
    return out


def check(config: Config) -> tuple[list[Problem], list[str]]:
    """(problems, warnings) of the gateway's config against its LiteLLM version."""
    gateway = gateway_of(config)
    accepted = accepted_keys(gateway.version)
    if accepted is None:
        return [], [
            f"{config.source}: gateway.version: no record of the keys LiteLLM {gateway.version} "
            "accepts, so its config is not checked (run scripts/litellm-accepted-keys with that "
            "version's python)",
        ]
    problems = []
    for section, keys in sorted(used_keys(settings(config)).items()):
        for key in sorted(keys - accepted.get(section, frozenset())):
            problems.append(
                Problem(
                    config.source,
                    "gateway",
                    f"LiteLLM {gateway.version} does not accept {section}.{key}",
                    "use another version, or report this as a bug in llamanix",
                )
            )
    return problems, []


# --- the unit (Debian hosts) -------------------------------------------------------------------


def venv_dir(version: str) -> str:
    return f"{VENV_ROOT}/{version}"


def _credential(instance: str) -> str:
    return f"key-{instance}"


def _systemd_word(text: str) -> str:
    """One ExecStart word, in systemd's double quotes: no specifier, no variable expanded."""
    text = text.replace("%", "%%").replace("$", "$$")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def start_script(config: Config) -> str:
    """What the unit's shell runs: each key from its credential into the variable LiteLLM
    reads it from, then LiteLLM itself (exec, so it is the unit's main process)."""
    gateway = gateway_of(config)
    cred = '"$CREDENTIALS_DIRECTORY/'
    lines = ["set -e", f'{MASTER_KEY_ENV}=$(cat {cred}{MASTER_KEY_CREDENTIAL}")']
    names = [MASTER_KEY_ENV]
    for d in deployments(config):
        if d.key_env and d.key_env not in names:
            lines.append(f'{d.key_env}=$(cat {cred}{_credential(d.instance)}")')
            names.append(d.key_env)
    lines.append("export " + " ".join(names))
    program = f"{venv_dir(gateway.version)}/bin/litellm"
    lines.append(
        f'exec {program} --config {cred}{CONFIG_FILE}" --host {shlex.quote(gateway.listen)} '
        f"--port {gateway.port}"
    )
    return "; ".join(lines)


def ready_script(config: Config) -> str:
    """Waits until LiteLLM's liveliness endpoint answers, or fails when LiteLLM exited."""
    gateway = gateway_of(config)
    python = f"{venv_dir(gateway.version)}/bin/python"
    url = connect_url(gateway.listen, gateway.port) + "/health/liveliness"
    probe = "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)"
    return (
        f"until {python} -c {shlex.quote(probe)} {shlex.quote(url)} 2>/dev/null; do "
        'kill -0 "$MAINPID" || exit 1; sleep 0.5; done'
    )


def render_unit(config: Config, digest: str) -> RenderedInstance:
    """``llamanix-gateway.service``: LiteLLM from its own venv, hardened like the servers,
    its config carried in the unit and every key loaded as a credential."""
    gateway = gateway_of(config)
    text = config_text(config)
    keys = [systemd.credential_path(MASTER_KEY_CREDENTIAL, gateway.api_key_file)]
    seen = set()
    for d in deployments(config):
        if d.key_file and d.instance not in seen:
            keys.append(systemd.credential_path(_credential(d.instance), d.key_file))
            seen.add(d.instance)
    state = "%C/llamanix-gateway"
    environment = [
        systemd.assignment("HOME", state, expand=True),
        systemd.assignment("XDG_CACHE_HOME", state, expand=True),
        # Else LiteLLM fetches its model cost map from GitHub at every start.
        systemd.assignment("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        # The venv is read-only to the unit.
        systemd.assignment("PYTHONDONTWRITEBYTECODE", "1"),
    ]
    unit = unit_template("gateway.service.j2").render(
        source=systemd.comment(Path(config.source).name),
        config_hash=digest[:19],
        version=gateway.version,
        exec_start=systemd.UnitText("/bin/sh -c " + _systemd_word(start_script(config))),
        # ${MAINPID} is the one variable systemd is meant to expand here.
        exec_start_post=systemd.UnitText(
            "/bin/sh -c " + _systemd_word(ready_script(config)).replace("$$MAINPID", "${MAINPID}")
        ),
        environment=environment,
        load_credentials=keys,
        config_name=CONFIG_FILE,
        credential=systemd.credential(CONFIG_FILE, text),
    )
    program = f"{venv_dir(gateway.version)}/bin/litellm"
    argv = [program, "--config", f"%d/{CONFIG_FILE}", "--host", gateway.listen]
    return RenderedInstance(
        name=UNIT_NAME,
        unit=unit_name(UNIT_NAME),
        unit_text=unit,
        argv=(*argv, "--port", str(gateway.port)),
        variant="litellm",
        source_revision=None,
        version=gateway.version,
        environment={},
        listen=gateway.listen,
        port=gateway.port,
        alias=None,
        gpu=False,
        config_name=CONFIG_FILE,
        config_text=text,
    )
