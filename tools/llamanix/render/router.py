"""A host's router: one endpoint in front of several instances (``[hosts.NAME.router]``).

Each member keeps the argv llamanix renders for its variant; the router only takes over its
address. Two kinds:

- ``llama-server``: upstream's router mode. The router is ``llama-server --models-preset
  FILE.ini`` without a model; it starts a child per member on demand, with its own binary and
  the member's preset section as flags. So every member runs one binary (``config.model``
  refuses a mix) and the preset must say exactly what the member's argv says.
- ``llama-swap``: one ``cmd`` per member, so any mix of binaries and variants.

Which members stay loaded together and which take turns is ``core.residency``'s decision, made
from ``plan``'s VRAM fit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llamanix.config.argv import Arg, flatten, instance_arg_pieces
from llamanix.config.model import Config, Instance, Router
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import Capabilities
from llamanix.core.residency import Residency, plan_residency
from llamanix.render import formats

# The fields of a member's argv the router owns: its address and key are the router's, and the
# router names each child after its section (llama-server) or model entry (llama-swap).
ROUTER_OWNED = ("listen", "port", "alias", "api_key_file")
PRESET_FILE = "router-presets.ini"
SWAP_FILE = "llama-swap.yaml"
# llama-swap replaces ${PORT} in cmd and proxy with the port it gives the member.
SWAP_PORT = "${PORT}"


@dataclass(frozen=True)
class Member:
    name: str  # the instance
    served_as: str  # the model name clients ask for: the alias, else the instance name
    pieces: tuple[Arg, ...]  # the member's own argv, program first

    @property
    def argv(self) -> list[str]:
        return flatten(list(self.pieces))


def served_name(inst: Instance) -> str:
    return inst.alias or inst.name


def router_of(config: Config, host: str) -> Router:
    router = config.hosts[host].router
    if router is None:
        raise UserError(
            Problem(
                config.source,
                f"hosts.{host}.router",
                "this host has no router",
                "add a [hosts.NAME.router] table",
            )
        )
    return router


def members(
    config: Config, host: str, caps: Mapping[str, Capabilities] | None = None
) -> list[Member]:
    """Each member's argv as its variant (and its probe, if given) spells it."""
    out: list[Member] = []
    for name in router_of(config, host).members:
        probe = (caps or {}).get(name, (caps or {}).get("*"))
        pieces = instance_arg_pieces(config, name, None, probe)
        out.append(Member(name, served_name(config.instances[name]), tuple(pieces)))
    return out


def residency(
    config: Config, host: str, vram: Mapping[str, int | None] | None, gpu_memory: int | None
) -> Residency:
    router = router_of(config, host)
    return plan_residency(router.members, vram or {}, gpu_memory, router.max_loaded)


# --- llama-server's router mode --------------------------------------------------------------


def _preset_keys(config: Config, member: Member) -> list[tuple[str, str]]:
    """A member's argv as preset keys: each flag without its dashes, its value (or true)."""
    where = f"instances.{member.name}"
    keys: list[tuple[str, str]] = []
    seen: set[str] = set()
    for arg in member.pieces[1:]:
        if arg.field in ROUTER_OWNED:
            continue
        for flag, value in _flag_values(arg):
            key = flag.lstrip("-")
            if key in seen:
                raise UserError(
                    Problem(
                        config.source,
                        f"{where}.{arg.field}",
                        f"{flag} appears twice in its argv, and a llama-server preset holds "
                        "each option once",
                        'give it once, or use kind = "llama-swap"',
                    )
                )
            try:
                keys.append((formats.ini_key(key), formats.ini_value(value)))
            except formats.FormatError as err:
                raise UserError(
                    Problem(
                        config.source,
                        f"{where}.{arg.field}",
                        f"{err}, which a llama-server preset cannot hold",
                        'rename the file, or use kind = "llama-swap"',
                    )
                ) from None
            seen.add(key)
    return keys


def _flag_values(arg: Arg) -> list[tuple[str, str]]:
    """(flag, value) pairs: a flag followed by a non-flag takes it as its value, a bare flag is
    "true" (extra_args may hold several flags)."""
    out: list[tuple[str, str]] = []
    tokens = list(arg.tokens)
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        if i + 1 < len(tokens) and not _is_flag(tokens[i + 1]):
            out.append((flag, tokens[i + 1]))
            i += 2
        else:
            out.append((flag, "true"))
            i += 1
    return out


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", token)


def preset_ini(config: Config, host: str, member_list: Sequence[Member]) -> str:
    """The --models-preset file: one section per member, named as clients ask for it."""
    router = router_of(config, host)
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for member in member_list:
        keys = _preset_keys(config, member)
        if router.idle_ttl:
            keys.append(("sleep-idle-seconds", str(router.idle_ttl)))
        try:
            name = formats.ini_section(member.served_as)
        except formats.FormatError as err:
            raise UserError(
                Problem(
                    config.source,
                    f"instances.{member.name}.alias",
                    str(err),
                    "write the part after the last ':' as the router would (upper case), or "
                    'use kind = "llama-swap"',
                )
            ) from None
        sections.append((name, keys))
    header = [
        f"Generated by llamanix: the router of host {host}.",
        "Each section is one member's argv as llamanix renders it for its variant.",
    ]
    return formats.ini_text(header, [("version", "1")], sections)


def llama_server_router_argv(
    config: Config,
    host: str,
    member_list: Sequence[Member],
    plan: Residency,
    preset_path: str,
    api_key_path: str | None = None,
) -> list[str]:
    """The router's own command line: the members' binary, no model, the preset."""
    router = router_of(config, host)
    program = member_list[0].pieces[0].tokens[0]
    argv = [program, "--models-preset", preset_path, "--host", router.listen]
    argv += ["--port", str(router.port), "--models-max", str(plan.max_loaded)]
    if api_key_path:
        argv += ["--api-key-file", api_key_path]
    return argv


# --- llama-swap ------------------------------------------------------------------------------


def swap_cmd(member: Member) -> list[str]:
    """The member's argv with the address llama-swap proxies to: loopback and ${PORT}."""
    out: list[str] = []
    for arg in member.pieces:
        if arg.field in ("listen", "port", "api_key_file"):
            continue
        out += arg.tokens
    return [*out, "--host", "127.0.0.1", "--port", SWAP_PORT]


def swap_yaml(
    config: Config,
    host: str,
    member_list: Sequence[Member],
    plan: Residency,
    health_timeout_s: int,
    check_endpoint: str = "/health",
) -> str:
    """llama-swap's config: a model entry per member and the groups of ``plan``."""
    router = router_of(config, host)
    models: JsonObject = {}
    for member in member_list:
        inst = config.instances[member.name]
        entry: JsonObject = {
            "cmd": " ".join(_shell_word(config, member, w) for w in swap_cmd(member)),
            "proxy": "http://127.0.0.1:" + SWAP_PORT,
            "checkEndpoint": check_endpoint,
        }
        if router.idle_ttl:
            entry["ttl"] = router.idle_ttl
        if inst.environment:
            entry["env"] = [
                _swap_env(config, member, k, v) for k, v in sorted(inst.environment.items())
            ]
        models[member.served_as] = entry
    data: JsonObject = {"healthCheckTimeout": health_timeout_s, "models": models}
    groups = _swap_groups(member_list, plan)
    if groups:
        data["groups"] = {
            name: {"swap": swap, "exclusive": False, "persistent": not swap, "members": [*names]}
            for name, (swap, names) in groups.items()
        }
    header = [
        f"Generated by llamanix: the router of host {host}.",
        "Each cmd is the member's argv as llamanix renders it for its variant.",
    ]
    return formats.yaml_text(header, data)


def _swap_groups(
    member_list: Sequence[Member], plan: Residency
) -> dict[str, tuple[bool, list[str]]]:
    served = {m.name: m.served_as for m in member_list}
    out: dict[str, tuple[bool, list[str]]] = {}
    if plan.resident:
        out["resident"] = (False, [served[n] for n in plan.resident])
    if plan.swapping:
        out["take-turns"] = (True, [served[n] for n in plan.swapping])
    return out


_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./:=,+@%-]+$")


def _swap_env(config: Config, member: Member, name: str, value: str) -> str:
    """One ``env`` entry of a member. llama-swap replaces ${env.NAME} macros anywhere in its
    file before it parses it, with no way to escape one: a value holding "${" is refused."""
    if "${" in value:
        raise UserError(
            Problem(
                config.source,
                f"instances.{member.name}.environment.{name}",
                "holds '${', which llama-swap would replace with one of its macros",
                'write the value without it, or use kind = "llama-server"',
            )
        )
    return f"{name}={value}"


def _shell_word(config: Config, member: Member, word: str) -> str:
    """llama-swap splits cmd like a shell; quote what it would split. It also replaces
    ${NAME} macros anywhere in cmd, with no way to escape one: a word of the config's that
    holds "${" is refused (only llamanix's own ${PORT} is meant for it)."""
    if word == SWAP_PORT:
        return word
    if "${" in word:
        raise UserError(
            Problem(
                config.source,
                f"instances.{member.name}",
                f"{word!r} holds '${{', which llama-swap would read as one of its macros",
                'rename the file or drop the argument, or use kind = "llama-server"',
            )
        )
    if _SHELL_SAFE.match(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"
