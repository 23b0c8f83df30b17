"""What a config would run: per host, each instance's command line, unit exposure and warnings."""

from __future__ import annotations

import tempfile
from pathlib import Path

from llamanix.config.drift import WHOLE, FieldDrift, drift_report
from llamanix.config.host_choice import pick_host
from llamanix.config.model import SPEC_PARAMS, Config, Host, Instance
from llamanix.config.probe_diff import flip_warning, probe_diff
from llamanix.core.address import is_loopback
from llamanix.core.errors import Problem, UserError
from llamanix.core.residency import plan_residency
from llamanix.core.schema import SPEC_TYPES_WITH_DRAFT_MODEL
from llamanix.core.state_dir import host_state_root
from llamanix.core.variants import VARIANTS
from llamanix.external import systemd_analyze
from llamanix.external.files import write_scratch
from llamanix.external.nix import locked_revisions
from llamanix.hosts.host_kind import refuse_unstated_nixos
from llamanix.model.gguf_header import has_chat_template
from llamanix.plan.host_plan import (
    Fit,
    GatewayPlan,
    HostPlan,
    InstanceRow,
    Plan,
    Replica,
    RouterPlan,
    UnreadableModel,
    VramFit,
)
from llamanix.render.host_render import instance_budget, member_vram, render_host
from llamanix.render.manifest import Render
from llamanix.render.paths import unseen_paths
from llamanix.render.units import CapabilityMap, capabilities_for, member_entries


def speculative_summary(inst: Instance) -> str:
    """The whole chain, each type with what belongs to it: the parameters to the first, the
    draft model to the type that loads it ("ngram-mod n_max=16 then mtp")."""
    spec = inst.speculative
    if not spec.enabled:
        return "none"
    stages = []
    for i, spec_type in enumerate(spec.types):
        parts = [spec_type]
        if i == 0:
            for key in SPEC_PARAMS:
                value = getattr(spec, key)
                if value is not None:
                    parts.append(f"{key}={value:g}")
        if spec.draft_model and (spec_type in SPEC_TYPES_WITH_DRAFT_MODEL or not spec.chain):
            parts.append(f"draft={Path(spec.draft_model).name}")
        stages.append(" ".join(parts))
    return " then ".join(stages)


def warnings_for(inst: Instance) -> list[str]:
    """Legal but probably not what the user meant."""
    spec = inst.speculative
    out: list[str] = []
    if not spec.enabled:
        if spec.draft_model:
            out.append("draft_model set but speculative.type = none: the draft is not loaded")
        stray = [
            k
            for k in ("n_max", "n_min", "p_min", "draft_gpu_layers")
            if getattr(spec, k) is not None
        ]
        if stray:
            out.append(f"{', '.join(stray)} set but speculative.type = none: ignored")
    if spec.type == "mtp" and spec.draft_model:
        out.append("mtp with a draft_model: only right for a predictor-only companion GGUF")
    if not is_loopback(inst.listen) and inst.api_key_file is None:
        out.append(
            f"listens on {inst.listen} without api_key_file: anyone who can reach it can use it"
        )
    return out


NO_CHAT_TEMPLATE = (
    "the model has no chat template of its own (a base model?): llama-server falls back to "
    "chatml and the model continues its markers instead of answering; send it raw text "
    'through /completion (bench, lossless and doctor: prompts with "text")'
)


def chat_template_warnings(inst: Instance) -> list[str]:
    """A model file readable here without a chat template; nothing when it is not readable."""
    return [NO_CHAT_TEMPLATE] if has_chat_template(Path(inst.model)) is False else []


def arch_warnings(host: Host, gpu: bool) -> list[str]:
    """A GPU instance on a host whose cuda_archs leave out its card's compute capability (the
    GPU table's): doctor's cuda-arch finding, said before anything is built or switched."""
    if not gpu or host.gpu is None:
        return []
    from llamanix.core.gpus import arch_mismatch, load_gpus

    card = load_gpus()[host.gpu]
    mismatch = arch_mismatch(card.label, card.compute_capability, host.name, host.cuda_archs)
    return [] if mismatch is None else [f"{mismatch.message} ({mismatch.fix})"]


def fit_and_ceiling(inst: Instance, host: Host) -> Fit | None:
    """VRAM fit and decode ceiling, when the host names a GPU and the model file is readable."""
    if host.gpu is None:
        return None
    from llamanix.core.gpus import load_gpus
    from llamanix.model.ceiling import decode_ceiling_tok_s, gpu_memory_bytes

    gpu = load_gpus()[host.gpu]
    try:
        model, budget = instance_budget(inst)
    except UserError as err:
        return UnreadableModel(gpu.name, str(err.problems[0]))
    return VramFit(
        gpu=gpu.name,
        vram_bytes=budget.total,
        gpu_memory_bytes=gpu_memory_bytes(gpu),
        ceiling_tok_s=decode_ceiling_tok_s(gpu.bandwidth_gb_s, model.weight_bytes_per_token()),
    )


def unseen(config: Config, render: Render, here: bool = True) -> list[Problem]:
    """Paths the host's units will not see or cannot use (see core.visibility).

    Not for a NixOS host (the module builds its units and puts the programs in the store) nor
    for one that ``llamanix up`` runs here (no sandbox); for a remote host (``target``), or
    any host when ``here`` is false (``validate --remote``), only where each path is counts,
    since its files are not here to read.
    """
    if render.kind == "nixos":
        return []
    # The managers (and the deploy records they read) load only where there is deploy state to
    # read: `plan` is meant to answer at once, and a host never switched has none.
    if host_state_root(Path(config.source), render.host).exists():
        from llamanix.hosts.managers import runs_under_up

        if runs_under_up(config, render.host):
            return []
    local = here and config.hosts[render.host].target is None
    return unseen_paths(config, render, local=local)


# Lines that name the instance (its description, command lines, environment and directory
# names) and that systemd-analyze's exposure score does not read; units alike but for these
# score the same (tests/test_plan.py scores each unit alone and compares), so one of them is
# scored for all: a plan of 20 like instances pays for one unit, not 20.
_NOT_SCORED = (
    "Description=",
    "ExecStart=",
    "ExecStartPost=",
    "Environment=",
    "StateDirectory=",
    "CacheDirectory=",
    "WorkingDirectory=",
    "#",
)


def sandbox_key(unit_text: str) -> str:
    """The unit's text without the lines its exposure score does not read."""
    return "\n".join(line for line in unit_text.splitlines() if not line.startswith(_NOT_SCORED))


def _exposures(render: Render, tmp: Path) -> dict[str, float]:
    """Every unit's offline exposure score, by unit file name, from one systemd-analyze run
    over one unit of each sandbox."""
    scored: dict[str, str] = {}  # sandbox key -> the unit scored for it
    alike: dict[str, str] = {}  # unit -> the unit whose score it takes
    for rendered in (*render.instances, *([render.router] if render.router else [])):
        first = scored.setdefault(sandbox_key(rendered.unit_text), rendered.unit)
        alike[rendered.unit] = first
        if first == rendered.unit:
            write_scratch(tmp / rendered.unit, rendered.unit_text)
    found = systemd_analyze.security_exposures([tmp / unit for unit in scored.values()])
    return {unit: found[first] for unit, first in alike.items() if first in found}


def _flip_warnings(inst: Instance, previous: CapabilityMap, caps: CapabilityMap) -> list[str]:
    before, after = capabilities_for(previous, inst.name), capabilities_for(caps, inst.name)
    if before is None or after is None:
        return []
    warning = flip_warning(probe_diff(before, after))
    return [warning] if warning else []


def _drift(
    config: Config, name: str, previous: CapabilityMap, caps: CapabilityMap
) -> tuple[FieldDrift, ...] | None:
    """Field by field, how the instance's flags move from the build it runs now (its
    --previous probe) to the build of --capabilities; None without both probes."""
    before, after = capabilities_for(previous, name), capabilities_for(caps, name)
    if before is None or after is None:
        return None
    return drift_report(config, before, after, (name,)).instances[0].fields


def _router_plan(config: Config, host: str) -> RouterPlan | None:
    """The host's router: its endpoint, and which members stay loaded together and which take
    turns (from each member's VRAM fit), and why."""
    router = config.hosts[host].router
    if router is None:
        return None
    gpu = config.hosts[host].gpu
    memory = None
    if gpu is not None:
        from llamanix.core.gpus import load_gpus
        from llamanix.model.ceiling import gpu_memory_bytes

        memory = gpu_memory_bytes(load_gpus()[gpu])
    vram = member_vram(config, host) or {}
    plan = plan_residency(router.members, vram, memory, router.max_loaded)
    return RouterPlan(
        kind=router.kind,
        address=f"{router.listen}:{router.port}",
        members={m: served_name(config.instances[m]) for m in router.members},
        resident=plan.resident,
        take_turns=plan.swapping,
        max_loaded=plan.max_loaded,
        reason=plan.reason,
        too_big=plan.too_big,
    )


def _gateway_plan(config: Config, chosen: tuple[str, ...] | None) -> GatewayPlan | None:
    """The gateway, when the config has one and the plan is not of other hosts alone
    (``chosen``: the hosts named, None when none was)."""
    gateway = config.gateway
    if gateway is None or (chosen is not None and gateway.host not in chosen):
        return None
    from llamanix.render.gateway import deployments

    groups: dict[str, list[Replica]] = {}
    for d in deployments(config):
        host_of = config.instances[d.instance].host
        groups.setdefault(d.group, []).append(Replica(d.instance, host_of, d.api_base))
    return GatewayPlan(
        kind=gateway.kind,
        host=gateway.host,
        address=f"{gateway.listen}:{gateway.port}",
        version=gateway.version,
        routing_strategy=gateway.routing_strategy,
        retries=gateway.retries,
        health_check_interval=gateway.health_check_interval,
        groups={g: tuple(rs) for g, rs in groups.items()},
    )


def _address(config: Config, host: str, name: str, own: str) -> str:
    """Where clients reach the instance: its own address, or its router's and its name there."""
    router = config.hosts[host].router
    if router is None or name not in router.members:
        return own
    return f"{router.listen}:{router.port} as {served_name(config.instances[name])}"


def served_name(inst: Instance) -> str:
    return inst.alias or inst.name


def _refuse_drift(
    config: Config, names: list[str], previous: CapabilityMap, caps: CapabilityMap
) -> None:
    """Before rendering against --capabilities: what that build refuses, each with the flag the
    instance has now, so the refusal reads as drift rather than as a bad config."""
    problems: list[Problem] = []
    for name in names:
        for d in _drift(config, name, previous, caps) or ():
            if d.change == "refused":
                now = " ".join(d.old) or "nothing rendered"
                problems.append(
                    Problem(
                        config.source,
                        f"instances.{name}.{d.field}" if d.field != WHOLE else f"instances.{name}",
                        f"the build of --capabilities refuses it (now: {now}): {d.message}",
                        d.fix,
                    )
                )
    if problems:
        raise UserError(problems)


def plan_config(
    config: Config,
    caps: CapabilityMap,
    host: str | tuple[str, ...] | None = None,
    security: bool = True,
    flake_dir: Path | None = None,
    previous: CapabilityMap | None = None,
) -> Plan:
    """``flake_dir`` holds the flake.lock whose pins are shown (default: beside the config).
    ``host``: one host, several (names of the config's hosts, in that order) or None (every
    host that runs an instance)."""
    if isinstance(host, tuple):
        hosts = list(host)
    elif host:
        hosts = [pick_host(config, host)]
    else:
        hosts = [h for h in config.hosts if config.instances_on(h)]
    refuse_unstated_nixos(config, hosts)
    if previous:
        _refuse_drift(
            config, [i.name for h in hosts for i in config.instances_on(h)], previous, caps
        )
    measure = security and systemd_analyze.available()
    pins = locked_revisions(flake_dir or Path(config.source).resolve().parent)
    plans: list[HostPlan] = []
    with tempfile.TemporaryDirectory(prefix="llamanix-plan-") as tmp:
        for name in hosts:
            render = render_host(config, name, caps)
            exposures = _exposures(render, Path(tmp)) if measure else {}
            rows = []
            for r in (*render.instances, *member_entries(config, render, caps)):
                inst = config.instances[r.name]
                fit = fit_and_ceiling(inst, config.hosts[name])
                rows.append(
                    InstanceRow(
                        name=r.name,
                        variant=r.variant,
                        pinned_revision=pins.get(VARIANTS[r.variant].flake_input or "nixpkgs"),
                        address=_address(config, name, r.name, f"{r.listen}:{r.port}"),
                        speculative=speculative_summary(inst),
                        speculative_types=inst.speculative.types,
                        argv=r.argv,
                        unit=r.unit,
                        gpu=r.gpu,
                        security_exposure=exposures.get(r.unit),
                        warnings=(
                            *warnings_for(inst),
                            *arch_warnings(config.hosts[name], r.gpu),
                            *chat_template_warnings(inst),
                            *r.warnings,
                            *_flip_warnings(inst, previous or {}, caps),
                        ),
                        drift=_drift(config, r.name, previous or {}, caps),
                        fit=fit,
                    )
                )
            plans.append(
                HostPlan(
                    name=name,
                    kind=render.kind,
                    instances=tuple(rows),
                    unseen_paths=tuple(str(p) for p in unseen(config, render)),
                    router=_router_plan(config, name),
                )
            )
    return Plan(config.source, tuple(plans), _gateway_plan(config, tuple(hosts) if host else None))
