"""The gateway: LiteLLM's proxy in front of the instances of every host (``[gateway]``).

Every instance is a replica in the model group named by its alias (else its name); LiteLLM
spreads a group's requests over its replicas and retries a failed one on another. llamanix's
plugin (render/litellm_plugin/llamanix_gateway.py), which LiteLLM loads as a callback, keeps
each conversation on the replica that holds its cache and checks each replica's ``/health``
(LiteLLM's own health checks would send completions). Here: the LiteLLM config
(``litellm.yaml``, the plugin's settings in it), the check of its keys against what the pinned
LiteLLM accepts, and the hardened unit that runs it on a Debian host. docs/gateway.md has the
defaults and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from llamanix.config.model import Config, Gateway, Instance
from llamanix.core.address import connect_url, remote_host, url_host
from llamanix.core.api_key import key_env
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.render import formats, systemd
from llamanix.render.manifest import RenderedInstance, unit_name
from llamanix.render.unit_templates import unit_template

CONFIG_FILE = "litellm.yaml"
UNIT_NAME = "gateway"
MASTER_KEY_CREDENTIAL = "master-key"
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
# Where a Debian host keeps each LiteLLM release's own venv (hosts.gateway_venv makes it).
VENV_ROOT = "/var/lib/llamanix/litellm"
# Seconds LiteLLM waits for one request: a long generation on a big model takes minutes.
REQUEST_TIMEOUT_S = 600
# The plugin LiteLLM loads (render/litellm_plugin/): its module, the callback in it, and the
# variable its settings reach it through (LiteLLM's config sets it: environment_variables).
PLUGIN_MODULE = "llamanix_gateway"
PLUGIN_CALLBACK = f"{PLUGIN_MODULE}.handler"
PLUGIN_SETTINGS_ENV = "LLAMANIX_GATEWAY"
# The Debian unit's state directory as LiteLLM sees it (StateDirectory=llamanix-gateway): where
# a rolling switch writes the routes the plugin follows (switch/cache_moves.py).
STATE_DIRECTORY = "/var/lib/llamanix-gateway"
ROUTES_FILE = f"{STATE_DIRECTORY}/routes.json"


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


def health_url(api_base: str) -> str:
    """A replica's ``/health`` (its server's, or its router's: neither loads a member)."""
    return api_base.removesuffix("/v1") + "/health"


def plugin_settings(config: Config) -> JsonObject:
    """What the plugin reads (its ``Settings``): the check interval, the routes file a rolling
    switch writes (a Debian gateway's; a NixOS one gets none), the LRU's bound, each model
    group's affinity, and each replica's ``/health`` by its deployment id."""
    gateway = gateway_of(config)
    found = deployments(config)
    routes = ROUTES_FILE if config.hosts[gateway.host].kind == "systemd" else None
    return {
        "version": 1,
        "interval": gateway.health_check_interval,
        "routes": routes,
        "conversations": gateway.conversations,
        "affinity": {g: gateway.affinity_of(g) for g in sorted({d.group for d in found})},
        "health": {d.instance: health_url(d.api_base) for d in found},
    }


def plugin_settings_text(config: Config) -> str:
    """The settings as one line of JSON, spelled as Nix's builtins.toJSON spells them (sorted
    keys, no spaces), so that the NixOS module's render is the same text."""
    return json.dumps(
        plugin_settings(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def settings(config: Config) -> JsonObject:
    """LiteLLM's config: the model list, the settings measured to keep clients served while
    replicas go down in turn, and the plugin (docs/gateway.md)."""
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
                # The deployment's id: the plugin and a rolling switch name it by instance.
                "model_info": {"id": d.instance},
            }
        )
    return {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": gateway.routing_strategy,
            "num_retries": gateway.retries,
            # Retry on another replica at once: a replica that is down stays down for seconds.
            "retry_after": 0,
            # A replica fenced for its restart fails every request sent to it for a second or
            # two; past half of a minute's requests LiteLLM would cool it down for 5 s, and a
            # rolling switch then fences the other one while the first is still cooling:
            # every request failed (measured: 132 in 5 s). The plugin's health checks and the
            # per-request failover already route around a replica that is down.
            "disable_cooldowns": True,
        },
        "general_settings": {
            "master_key": f"os.environ/{MASTER_KEY_ENV}",
            # LiteLLM's own checks send each replica a completion: the plugin checks /health.
            "background_health_checks": False,
        },
        "litellm_settings": {"request_timeout": REQUEST_TIMEOUT_S, "callbacks": [PLUGIN_CALLBACK]},
        "environment_variables": {PLUGIN_SETTINGS_ENV: plugin_settings_text(config)},
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


def key_credentials(config: Config) -> list[tuple[str, str]]:
    """(variable, credential) of every key LiteLLM's config names: the master key, then each
    replica's once."""
    found = [(MASTER_KEY_ENV, MASTER_KEY_CREDENTIAL)]
    for d in deployments(config):
        pair = (d.key_env, _credential(d.instance)) if d.key_env else None
        if pair is not None and pair not in found:
            found.append(pair)
    return found


def start_argv(config: Config, llamanix: Sequence[str]) -> list[str]:
    """What the unit runs: llamanix's ``gateway-exec`` (``llamanix``: how the unit runs
    llamanix), which reads each key from its credential into the variable LiteLLM reads it
    from, puts the plugin's directory on LiteLLM's path and execs LiteLLM with its own argv.
    No shell: every config value is one argument of its own."""
    gateway = gateway_of(config)
    argv = [*llamanix, "gateway-exec"]
    for variable, credential in key_credentials(config):
        argv += ["--credential-env", f"{variable}={credential}"]
    argv += ["--", f"{venv_dir(gateway.version)}/bin/litellm", "--config", f"%d/{CONFIG_FILE}"]
    return [*argv, "--host", gateway.listen, "--port", str(gateway.port)]


def ready_argv(config: Config, llamanix: Sequence[str]) -> list[str]:
    """Waits until LiteLLM's liveliness endpoint answers, or fails once LiteLLM has exited."""
    gateway = gateway_of(config)
    url = connect_url(gateway.listen, gateway.port) + "/health/liveliness"
    return [*llamanix, "gateway-ready", "--url", url, "--pid", "$MAINPID"]


def render_unit(config: Config, digest: str, llamanix: Sequence[str]) -> RenderedInstance:
    """``llamanix-gateway.service``: LiteLLM from its own venv, hardened like the servers,
    its config carried in the unit and every key loaded as a credential; ``llamanix``: how
    the unit runs llamanix (its ``gateway-exec`` starts LiteLLM)."""
    gateway = gateway_of(config)
    text = config_text(config)
    keys = [systemd.credential_path(MASTER_KEY_CREDENTIAL, gateway.api_key_file)]
    seen = set()
    for d in deployments(config):
        if d.key_file and d.instance not in seen:
            keys.append(systemd.credential_path(_credential(d.instance), d.key_file))
            seen.add(d.instance)
    config_arg = f"%d/{CONFIG_FILE}"
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
        exec_start=systemd.exec_line(start_argv(config, llamanix), keep=(config_arg,)),
        # $MAINPID is the one variable systemd is meant to expand here.
        exec_start_post=systemd.exec_line(ready_argv(config, llamanix), keep=("$MAINPID",)),
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
