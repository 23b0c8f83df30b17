"""Turn one instance into the exact llama-server argv for a variant.

Each piece of the command line remembers the config field it came from, so a flag a probed
binary does not know is reported against the field the user wrote, not against a flag name.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamanix.config.model import (
    SPEC_PARAMS,
    Config,
    Host,
    Instance,
    binary_of,
    check_instance,
    missing_binary,
    suggest,
)
from llamanix.core.errors import Problem, UserError
from llamanix.core.probe import FLAG, Capabilities
from llamanix.core.variants import DRAFTER_SETTINGS, VARIANTS, Dialect, Variant, effective_variant

# ik and other integer-only builds: any count above the model's layer count offloads them all.
ALL_LAYERS = "999"
# Where a warm switch has the server write each slot's cache: the unit's own state directory
# (systemd's %S; ``llamanix up`` puts it under its render directory). Every dialect spells the
# flag the same (tests/data/help).
SLOT_SAVE_FLAG = "--slot-save-path"


def state_dir_spec(name: str) -> str:
    """An instance's state directory as its unit names it (StateDirectory=llamanix-NAME)."""
    return f"%S/llamanix-{name}"


@dataclass(frozen=True)
class Arg:
    field: str
    tokens: tuple[str, ...]


def _layers(value: int | str, dialect: Dialect) -> str:
    if value == "all" and not dialect.layers_words:
        return ALL_LAYERS
    return str(value)


def _number(value: float) -> str:
    return f"{value:g}"


def program_for(inst: Instance, host: Host, variant: Variant) -> str:
    binary = binary_of(inst, host, variant)
    if binary is not None:
        return binary
    missing = missing_binary(inst, host, variant)
    if missing is not None:  # check_instance refuses it before rendering
        raise UserError(Problem("", f"instances.{inst.name}.variant", *missing))
    # NixOS: the module passes each instance's package as its binary (modules/llamanix.nix);
    # a render from the TOML alone names the program the package provides.
    return "llama-server"


def instance_args(
    inst: Instance, host: Host, variant: Variant, api_key_path: str | None = None
) -> list[Arg]:
    """The command line as (field, tokens) pieces, program first."""
    d = variant.dialect
    f = d.flags
    args = [
        Arg("binary", (program_for(inst, host, variant),)),
        Arg("model", (f["model"], inst.model)),
    ]

    def opt(name: str, value: object | None) -> None:
        if value is not None:
            args.append(Arg(name, (f[name], str(value))))

    opt("alias", inst.alias)
    opt("listen", inst.listen)
    opt("port", inst.port)
    opt("context", inst.context)
    if inst.gpu_layers is not None:
        args.append(Arg("gpu_layers", (f["gpu_layers"], _layers(inst.gpu_layers, d))))
    opt("flash_attn", inst.flash_attn)
    opt("cache_type_k", inst.cache_type_k)
    opt("cache_type_v", inst.cache_type_v)
    opt("parallel", inst.parallel)
    opt("batch", inst.batch)
    opt("ubatch", inst.ubatch)
    opt("threads", inst.threads)
    # jinja = true and an absent key mean the same (on), so they render the same argv; the flag
    # is only said where the variant's default is off. (The NixOS module always passes the
    # option's value, true by default: both front ends must give the same units.)
    if inst.jinja is not False and not d.jinja_default:
        args.append(Arg("jinja", (f["jinja"],)))
    elif inst.jinja is False and d.jinja_default and d.no_jinja_flag:
        args.append(Arg("jinja", (d.no_jinja_flag,)))
    opt("reasoning_budget", inst.reasoning_budget)
    if inst.metrics:
        args.append(Arg("metrics", (f["metrics"],)))
    if inst.api_key_file is not None:
        args.append(Arg("api_key_file", (f["api_key_file"], api_key_path or inst.api_key_file)))
    if inst.warm_switch:
        args.append(Arg("warm_switch", (SLOT_SAVE_FLAG, state_dir_spec(inst.name))))
    args.extend(_speculative_args(inst, variant))
    if inst.extra_args:
        args.append(Arg("extra_args", tuple(inst.extra_args)))
    return args


def _speculative_args(inst: Instance, variant: Variant) -> list[Arg]:
    spec = inst.speculative
    if not spec.enabled:
        return []
    d = variant.dialect
    f = d.flags
    spellings = [variant.spec_spelling(t) for t in spec.types]
    if None in spellings:  # check_instance refuses this before rendering
        raise AssertionError(f"{spec.label} unsupported by {variant.name}")
    params = d.spec_params.get(spec.type, {})
    out: list[Arg] = []
    if spec.draft_model is not None:
        out.append(Arg("speculative.draft_model", (f["draft_model"], spec.draft_model)))
        if spec.draft_gpu_layers is not None:
            out.append(
                Arg(
                    "speculative.draft_gpu_layers",
                    (f["draft_gpu_layers"], _layers(spec.draft_gpu_layers, d)),
                )
            )
    for key in DRAFTER_SETTINGS:
        value = getattr(spec, key)
        if value is True:
            out.append(Arg(f"speculative.{key}", (f[key],)))
        elif value is not None and value is not False:
            out.append(Arg(f"speculative.{key}", (f[key], str(value))))
    values = [(p, getattr(spec, p)) for p in SPEC_PARAMS]
    given = [(p, v) for p, v in values if v is not None]
    if d.spec_style == "stages":
        # ik: one --spec-type per stage; the parameters ride on the first stage.
        for i, spelling in enumerate(spellings):
            stage = str(spelling)
            if i == 0 and given:
                stage += ":" + ",".join(f"{params[p]}={_number(v)}" for p, v in given)
            out.append(Arg("speculative.type", (f["spec_type"], stage)))
        return out
    if spellings[0]:
        out.append(Arg("speculative.type", (f["spec_type"], ",".join(map(str, spellings)))))
    for p, v in given:
        out.append(Arg(f"speculative.{p}", (params[p], _number(v))))
    return out


def resolve_variant(inst: Instance, variant: str | None, source: str) -> Variant:
    name = variant or inst.variant
    if name not in VARIANTS:
        raise UserError(
            Problem(
                source, "--variant", f"unknown variant '{name}'", suggest(name, tuple(VARIANTS))
            )
        )
    return VARIANTS[name]


def instance_arg_pieces(
    config: Config,
    name: str,
    variant: str | None = None,
    capabilities: Capabilities | None = None,
    api_key_path: str | None = None,
) -> list[Arg]:
    """Checked argv pieces; raises UserError when the variant or the probed binary can't do it."""
    if name not in config.instances:
        raise UserError(
            Problem(
                config.source,
                f"instances.{name}",
                "no such instance",
                suggest(name, tuple(config.instances)),
            )
        )
    inst = config.instances[name]
    host = config.host_of(inst)
    chosen, _ = effective_variant(resolve_variant(inst, variant, config.source), capabilities)
    problems = [
        Problem(
            config.source,
            f"instances.{name}.{where}" if where else f"instances.{name}",
            message,
            fix,
        )
        for where, message, fix in check_instance(inst, host, chosen)
    ]
    if problems:
        raise UserError(problems)
    args = instance_args(inst, host, chosen, api_key_path)
    if capabilities is not None and SLOT_SAVE_FLAG not in capabilities.flags:
        # A build without the slot API still serves: its switches are cold, and the switch
        # says why (hosts.warm), rather than the render refusing the instance.
        args = [a for a in args if a.field != "warm_switch"]
    if capabilities is not None:
        problems = [
            Problem(config.source, f"instances.{name}.{where}", message, fix)
            for where, message, fix in check_against(
                capabilities, args, chosen.dialect.unlisted_flags
            )
        ]
        if problems:
            raise UserError(problems)
    return args


def check_against(
    caps: Capabilities, args: list[Arg], unlisted: tuple[str, ...] = ()
) -> list[tuple[str, str, str]]:
    """(field, message, fix) for every flag or value this binary would not take.

    unlisted: flags the dialect's parser takes although its --help does not print them.
    """
    known = set(caps.flags) | set(unlisted)
    out: list[tuple[str, str, str]] = []
    for arg in args[1:]:
        tokens = arg.tokens
        flags = (
            [t for t in tokens if FLAG.fullmatch(t)] if arg.field == "extra_args" else [tokens[0]]
        )
        for flag in flags:
            if flag not in known:
                hint = (
                    f"{flag} was removed from this build"
                    if flag in caps.removed_flags
                    else f"{flag} is not accepted by this build"
                )
                out.append(
                    (
                        arg.field,
                        f"{hint}: {caps.describe()}",
                        "choose the variant that matches this binary, or re-probe it",
                    )
                )
        if arg.field == "speculative.type" and caps.spec_types:
            stage = tokens[1].split(":", 1)[0]
            for name in stage.split(",") if ":" not in tokens[1] else [stage]:
                if name not in caps.spec_types:
                    out.append(
                        (
                            arg.field,
                            f"--spec-type {name} is not known to {caps.describe()}",
                            "it knows: " + ", ".join(caps.spec_types),
                        )
                    )
        if (
            arg.field == "flash_attn"
            and caps.flash_attn_values
            and (tokens[1] not in caps.flash_attn_values)
        ):
            out.append(
                (
                    arg.field,
                    f"-fa {tokens[1]} is not accepted by {caps.describe()}",
                    "use one of: " + ", ".join(caps.flash_attn_values),
                )
            )
        allowed = caps.cache_types_for(arg.field) if "cache_type" in arg.field else []
        if allowed and tokens[1] not in allowed:
            out.append(
                (
                    arg.field,
                    f"cache type {tokens[1]} is not known to {caps.describe()}",
                    "use one of: " + ", ".join(allowed),
                )
            )
    return out


def flatten(args: list[Arg]) -> list[str]:
    return [token for arg in args for token in arg.tokens]


def dialect_warning(
    config: Config, name: str, variant: str | None = None, capabilities: Capabilities | None = None
) -> str | None:
    """One line when the probed binary speaks another dialect than the variant declares."""
    inst = config.instances[name]
    _, warning = effective_variant(resolve_variant(inst, variant, config.source), capabilities)
    return warning


def instance_argv(
    config: Config,
    name: str,
    variant: str | None = None,
    capabilities: Capabilities | None = None,
    api_key_path: str | None = None,
) -> list[str]:
    """The exact argv for instance NAME, program first."""
    return flatten(instance_arg_pieces(config, name, variant, capabilities, api_key_path))
