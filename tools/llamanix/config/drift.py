"""The flag-drift report: what a config's instances would become on another build.

A pin move swaps the binary under a config that does not change. Rendering every instance
against the probe of the build it runs now (OLD) and the probe of the build the pin would bring
(NEW) shows, per config field, whether its flags stay, change spelling (llamanix renders the
new one: nothing to do), become refused (the config must change, and the refusal says how),
stop being rendered, or become possible. That is the list a user needed before BeeLlama moved
``dflash`` to ``draft-dflash`` and its cache types from ``turbo*`` to ``kvarn*``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

from llamanix.config.argv import Arg, dialect_warning, instance_arg_pieces
from llamanix.config.model import Config
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, JsonShape, json_via
from llamanix.core.json_value import JsonObject
from llamanix.core.probe import Capabilities

Change = Literal["respelled", "refused", "no longer rendered", "now rendered", "now accepted"]
# Field name used for a problem that names the instance rather than one of its keys.
WHOLE = "(instance)"
_NOTHING_TO_DO = "none: llamanix renders the new spelling"


@dataclass(frozen=True)
class FieldDrift(JsonRecord):
    """One config field whose flags differ between the two builds; written with its line."""

    instance: str
    field: str
    change: Change
    old: tuple[str, ...]  # the tokens OLD renders; () where it rendered nothing or refused
    new: tuple[str, ...]  # the tokens NEW renders; () where it renders nothing or refuses
    message: str  # the refusal, where one build refuses the field
    fix: str

    def line(self) -> str:
        old = " ".join(self.old) or "-"
        new = " ".join(self.new) or "-"
        head = f"{self.instance}.{self.field}: {self.change}: {old} -> {new}"
        if self.change == "refused":
            return f"{head}: {self.message} (fix: {self.fix})"
        if self.change == "now accepted":
            return f"{head} ({self.message})"
        return f"{head} ({self.fix})" if self.fix else head

    json_shape: ClassVar[JsonShape] = JsonShape(computed={"line": lambda f: f.line()})


@dataclass(frozen=True)
class InstanceDrift(JsonRecord):
    """One instance's drift; its name is the key it is kept under."""

    instance: str = dataclasses.field(metadata=JSON_SKIP)
    fields: tuple[FieldDrift, ...]
    warning: str | None  # NEW's dialect warning (a build llamanix has no recording of)

    json_shape: ClassVar[JsonShape] = JsonShape(order=("warning", "fields"))

    @property
    def refused(self) -> bool:
        return any(f.change == "refused" for f in self.fields)


def _by_instance(instances: tuple[InstanceDrift, ...]) -> JsonObject:
    return {i.instance: i.to_json() for i in instances}


@dataclass(frozen=True)
class DriftReport(JsonRecord):
    old: str  # each build as its probe describes it
    new: str
    # Written as an object by instance name.
    instances: tuple[InstanceDrift, ...] = dataclasses.field(metadata=json_via(_by_instance))

    @property
    def refused(self) -> tuple[FieldDrift, ...]:
        return tuple(f for i in self.instances for f in i.fields if f.change == "refused")

    def lines(self) -> list[str]:
        out = [f"flag drift from {self.old} to {self.new}:"]
        for inst in self.instances:
            if inst.warning:
                out.append(f"  {inst.instance}: warning: {inst.warning}")
            out += [f"  {f.line()}" for f in inst.fields]
            if not inst.fields and not inst.warning:
                out.append(f"  {inst.instance}: renders the same")
        return out


@dataclass(frozen=True)
class _Render:
    tokens: dict[str, tuple[str, ...]]  # field -> its tokens, in argv order
    refusals: dict[str, Problem]  # field -> the first problem naming it


def _field_of(problem: Problem, name: str) -> str:
    prefix = f"instances.{name}"
    if problem.field.startswith(prefix + "."):
        return problem.field[len(prefix) + 1 :]
    return WHOLE


def _render(config: Config, name: str, caps: Capabilities) -> _Render:
    try:
        pieces: list[Arg] = instance_arg_pieces(config, name, capabilities=caps)
    except UserError as err:
        refusals: dict[str, Problem] = {}
        for problem in err.problems:
            refusals.setdefault(_field_of(problem, name), problem)
        return _Render({}, refusals)
    tokens: dict[str, tuple[str, ...]] = {}
    for arg in pieces[1:]:  # the program is the build's, not a config field's
        tokens[arg.field] = tokens.get(arg.field, ()) + arg.tokens
    return _Render(tokens, {})


def _compare(name: str, old: _Render, new: _Render) -> list[FieldDrift]:
    out: list[FieldDrift] = []
    fields = list(dict.fromkeys([*old.tokens, *old.refusals, *new.tokens, *new.refusals]))
    for field in fields:
        before, after = old.tokens.get(field), new.tokens.get(field)
        refused_before, refused_after = old.refusals.get(field), new.refusals.get(field)
        if refused_after is not None:
            if refused_before is None:
                out.append(
                    FieldDrift(
                        name,
                        field,
                        "refused",
                        before or (),
                        (),
                        refused_after.message,
                        refused_after.fix,
                    )
                )
            continue
        if new.refusals:
            # NEW refused another field of this instance, so it rendered nothing to compare.
            continue
        if refused_before is not None or (old.refusals and after is not None):
            if refused_before is not None:
                out.append(
                    FieldDrift(
                        name,
                        field,
                        "now accepted",
                        (),
                        after or (),
                        f"the old build refused it: {refused_before.message}",
                        "",
                    )
                )
            continue
        if before == after:
            continue
        if before is None:
            out.append(
                FieldDrift(
                    name, field, "now rendered", (), after or (), "", "none: the new build needs it"
                )
            )
        elif after is None:
            out.append(
                FieldDrift(
                    name,
                    field,
                    "no longer rendered",
                    before,
                    (),
                    "",
                    "none if the new build's default is what you want; otherwise see the "
                    "variant's notes in docs/variants.md",
                )
            )
        else:
            out.append(FieldDrift(name, field, "respelled", before, after, "", _NOTHING_TO_DO))
    return out


def drift_report(
    config: Config,
    old: Capabilities,
    new: Capabilities,
    instances: tuple[str, ...] | None = None,
) -> DriftReport:
    """Every instance (or those named) rendered against OLD and NEW, field by field."""
    names = instances if instances is not None else tuple(config.instances)
    rows: list[InstanceDrift] = []
    for name in names:
        before, after = _render(config, name, old), _render(config, name, new)
        warning = None
        if not after.refusals:
            warning = dialect_warning(config, name, capabilities=new)
        rows.append(InstanceDrift(name, tuple(_compare(name, before, after)), warning))
    return DriftReport(old.describe(), new.describe(), tuple(rows))
