"""The one source of truth for the config schema.

llamanix.toml, the NixOS module's options (modules/llamanix.nix reads ``data/schema.json``,
which ``llamanix schema --json`` regenerates and a test keeps current) and the config reference
in docs/configuration.md are all made from the tables below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from llamanix.core.json_codec import (
    JSON_SKIP,
    OMIT_EMPTY,
    OMIT_NONE,
    JsonRecord,
    JsonShape,
    json_key,
)
from llamanix.core.json_value import JsonObject
from llamanix.core.types import TYPES, TextKind, types_json

# Field kinds. Each maps to a TOML value check here and to a lib.types type in the module.
STR = "str"
INT = "int"
FLOAT = "float"
BOOL = "bool"
PATH = "path"  # an absolute path, as a string
ENUM = "enum"
ENUM_LIST = "enum_list"  # one of the values, or a non-empty list of them
LAYERS = "layers"  # integer >= 0, "all" or "auto"
LIST_STR = "list_str"
DICT_STR = "dict_str"


@dataclass(frozen=True)
class Field(JsonRecord):
    """One config field as schema.json describes it: a key is written only where the field
    says something (its name is the key it is kept under)."""

    name: str = field(metadata=JSON_SKIP)
    kind: str = field(metadata=json_key("type"))
    doc: str
    default: Any = None  # None: absent, the binary's own default applies
    values: tuple[str, ...] = field(default=(), metadata=OMIT_EMPTY)
    required: bool = field(default=False, metadata=OMIT_EMPTY)
    example: Any = field(default=None, metadata=OMIT_NONE)
    minimum: float | None = field(default=None, metadata=OMIT_NONE)
    maximum: float | None = field(default=None, metadata=OMIT_NONE)
    # The declared type (core.types) of a string field's value, of each item of a list of
    # strings, of each value of a table of strings; a path is always of type "path".
    text: TextKind | None = field(default=None, metadata=OMIT_NONE)
    # A table of strings: the type of its keys.
    keys: TextKind | None = field(default=None, metadata=OMIT_NONE)

    json_shape: ClassVar[JsonShape] = JsonShape(
        order=(
            "type",
            "doc",
            "default",
            "text",
            "keys",
            "values",
            "required",
            "example",
            "minimum",
            "maximum",
        )
    )

    def __post_init__(self) -> None:
        if self.kind == PATH and self.text is None:
            object.__setattr__(self, "text", "path")
        # Every string a config carries has a declared type: a new field without one is a
        # mistake here, caught at import.
        if self.kind in (STR, PATH, LIST_STR, DICT_STR) and self.text is None:
            raise AssertionError(f"schema field {self.name!r} has no declared text type")
        if self.kind == DICT_STR and self.keys is None:
            raise AssertionError(f"schema field {self.name!r} has no declared key type")


HostKind = Literal["nixos", "systemd", "systemd-user"]
# What puts a host's instances behind one endpoint (docs/routers.md).
RouterKind = Literal["llama-server", "llama-swap"]
ROUTER_KINDS: tuple[RouterKind, ...] = get_args(RouterKind)
# The variant names (core.variants holds one registry entry for each; a test keeps them equal).
VariantName = Literal["nixpkgs", "upstream", "ik", "mtp", "beellama"]
VARIANT_NAMES: tuple[VariantName, ...] = get_args(VariantName)
HOST_KINDS: tuple[HostKind, ...] = get_args(HostKind)
# What runs the one endpoint in front of several hosts (docs/gateway.md).
GatewayKind = Literal["litellm"]
GATEWAY_KINDS: tuple[GatewayKind, ...] = get_args(GatewayKind)
# The LiteLLM a gateway runs unless the config names another: the one place it is pinned. The
# newer releases' [proxy] extra does not install from PyPI as CI reaches it (docs/gateway.md).
LITELLM_VERSION = "1.106.12"
# Releases that must never be installed, each with why (docs/gateway.md).
LITELLM_REFUSED = {
    "1.82.7": "was a compromised release on PyPI",
    "1.82.8": "was a compromised release on PyPI",
}
# LiteLLM 1.106.12's routing strategies (the values of its RoutingStrategyName).
RoutingStrategy = Literal[
    "simple-shuffle",
    "least-busy",
    "usage-based-routing",
    "latency-based-routing",
    "cost-based-routing",
    "usage-based-routing-v2",
    "lar1",
]
ROUTING_STRATEGIES: tuple[RoutingStrategy, ...] = get_args(RoutingStrategy)
# How a GPU system unit reaches the NVIDIA devices (render/templates/llamanix.service.j2 says
# what each one writes). "device-allow" is what nixpkgs' ollama and llama-cpp modules do;
# "private-dev" has not yet run CUDA on a real GPU.
GpuSandbox = Literal["device-allow", "private-dev"]
GPU_SANDBOXES: tuple[GpuSandbox, ...] = get_args(GpuSandbox)
# How nixos-rebuild gets root on a NixOS host's target (external/nix.py's sudo_flag).
NixosSudo = Literal["auto", "sudo", "use-remote-sudo", "none"]
NIXOS_SUDO: tuple[NixosSudo, ...] = get_args(NixosSudo)
FLASH_ATTN = ("on", "off", "auto")
# The cache types every variant shares; a variant may add more (ik: q6_0, q8_KV; BeeLlama: the
# TurboQuant types). The config accepts all of them; the variant check narrows it down.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
IK_CACHE_TYPES = ("q6_0", "q8_KV")
TURBO_CACHE_TYPES = ("turbo2", "turbo3", "turbo4", "turbo2_tcq", "turbo3_tcq")
# BeeLlama v0.4's -ctv list (docs/variants.md names where it was read): KVarN and more q types.
KVARN_CACHE_TYPES = (
    "q6_1",
    "q3_0",
    "q3_1",
    "q2_0",
    "q2_1",
    "kvarn2",
    "kvarn3",
    "kvarn4",
    "kvarn5",
    "kvarn6",
    "kvarn8",
)
ALL_CACHE_TYPES = (*CACHE_TYPES, *IK_CACHE_TYPES, *TURBO_CACHE_TYPES, *KVARN_CACHE_TYPES)
SPEC_TYPES = (
    "none",
    "draft",
    "mtp",
    "dflash",
    "dspark",
    "eagle3",
    "ngram-simple",
    "ngram-mod",
    "ngram-cache",
    "ngram-map-k",
    "ngram-map-k4v",
    "copyspec",
    "suffix",
    "recycle",
)
# Speculative types that need a separate draft model file.
SPEC_TYPES_WITH_DRAFT_MODEL = ("draft", "dflash", "dspark", "eagle3")
# Types that draft with a model context (the draft file's, or the target's own MTP heads): a
# chain holds at most one, and only they use the drafter's cache types, device and CPU-MoE.
SPEC_DRAFTERS = ("mtp", *SPEC_TYPES_WITH_DRAFT_MODEL)

# Upper bounds: each above what a real machine uses, so that a slip (an extra digit, a byte count
# pasted for a token count) is refused here instead of rendered into argv.
MAX_TOKENS = 2**24  # context, batches, budgets: above the longest trained context (10M tokens)
MAX_SLOTS = 256  # llama.cpp's LLAMA_MAX_SEQ: it refuses more sequences (slots) than this
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS
MAX_LAYERS = 9999  # no model has this many layers; "all" offloads every one
MAX_DRAFT = 1024  # tokens drafted per step
MAX_PORT = 65535
MAX_SECONDS = 365 * 24 * 3600  # a year

HOST_FIELDS: tuple[Field, ...] = (
    Field("kind", ENUM, "How units are installed on this host.", "nixos", HOST_KINDS),
    Field(
        "target",
        STR,
        "ssh target (user@host) for remote hosts; absent means this machine.",
        example="root@gpu1",
        text="ssh_target",
    ),
    Field(
        "gpu",
        STR,
        "GPU model, a name from the GPU table (`llamanix model ceiling --list`).",
        example="rtx5090",
        text="name",
    ),
    Field(
        "cuda_archs",
        LIST_STR,
        'CUDA compute capabilities this host\'s builds are compiled for, e.g. ["8.6", "12.0"].',
        example=["12.0"],
        text="cuda_arch",
    ),
    Field(
        "binaries",
        DICT_STR,
        "Path of llama-server per variant on systemd hosts; an instance whose variant has no "
        "entry (and no `binary` of its own) is refused. NixOS hosts use the flake's packages.",
        example={"upstream": "/opt/llama.cpp/bin/llama-server"},
        text="program",
        keys="name",
    ),
    Field(
        "gpu_sandbox",
        ENUM,
        "How GPU system units reach the NVIDIA devices: `device-allow` keeps the host's /dev "
        "and lets only the NVIDIA devices open (as nixpkgs' ollama and llama-cpp modules do); "
        "`private-dev` gives a private /dev with the NVIDIA nodes bound in (not yet verified "
        "on a real GPU). User units and CPU units ignore it.",
        "device-allow",
        GPU_SANDBOXES,
    ),
    Field(
        "build_host",
        STR,
        "NixOS hosts: the ssh target whose Nix builds the system (nixos-rebuild --build-host), "
        "so CUDA builds run there rather than on the machine running llamanix; absent: this "
        "machine builds.",
        example="root@builder",
        text="ssh_target",
    ),
    Field(
        "sudo",
        ENUM,
        "NixOS hosts: how nixos-rebuild gets root on `target`. `auto`: nothing for a `root@` "
        "target, or for this machine when llamanix runs as root, else `--sudo` "
        "(nixos-rebuild-ng, NixOS 25.11 on); `sudo`: always `--sudo`; `use-remote-sudo`: the "
        "older nixos-rebuild's `--use-remote-sudo`; `none`: nothing.",
        "auto",
        NIXOS_SUDO,
    ),
)

ROUTER_FIELDS: tuple[Field, ...] = (
    Field(
        "kind",
        ENUM,
        "`llama-server`: its router mode (--models-preset), one binary for every member, so "
        "one variant; `llama-swap`: one command per member, any mix of variants.",
        values=ROUTER_KINDS,
        required=True,
    ),
    Field(
        "members",
        LIST_STR,
        "Instances of this host served behind the router's one endpoint, each under its alias "
        "(else its name); their own listen and port become internal.",
        required=True,
        example=["qwen27b", "small"],
        text="name",
    ),
    Field("listen", STR, "Address the router listens on.", "127.0.0.1", text="listen"),
    Field("port", INT, "Port of the router's endpoint.", 8080, minimum=1, maximum=MAX_PORT),
    Field(
        "idle_ttl",
        INT,
        "Seconds a loaded member may sit idle before it is unloaded; 0 keeps it loaded.",
        0,
        minimum=0,
        maximum=MAX_SECONDS,
    ),
    Field(
        "max_loaded",
        INT,
        "Members loaded at once; absent: as many as fit together in the host GPU's memory "
        "(`llamanix plan` shows which), or all of them without a GPU table entry.",
        minimum=1,
        maximum=MAX_SLOTS,
    ),
    Field(
        "api_key_file",
        PATH,
        "File holding the router endpoint's API key (read at start, never in argv or unit text).",
    ),
    Field(
        "keyless",
        BOOL,
        "Serve on a `listen` beyond loopback without `api_key_file`, on purpose: anyone who "
        "reaches the port can use the router. Without it, validate refuses such a listener.",
        False,
    ),
    Field(
        "binary",
        PATH,
        "llama-swap's path on systemd hosts (NixOS hosts use nixpkgs' llama-swap package).",
        example="/usr/local/bin/llama-swap",
        text="program",
    ),
)

GATEWAY_FIELDS: tuple[Field, ...] = (
    Field(
        "kind",
        ENUM,
        "What runs the gateway: `litellm`, LiteLLM's proxy in front of every instance of every "
        "host, one model group per alias (docs/gateway.md).",
        values=GATEWAY_KINDS,
        required=True,
    ),
    Field(
        "host",
        STR,
        "The host (a [hosts.NAME] table of kind `systemd` or `nixos`) the gateway runs on.",
        required=True,
        example="box3",
        text="name",
    ),
    Field("listen", STR, "Address the gateway listens on.", "127.0.0.1", text="listen"),
    Field("port", INT, "Port of the gateway's endpoint.", 4000, minimum=1, maximum=MAX_PORT),
    Field(
        "api_key_file",
        PATH,
        "File holding the gateway's master key (a credential: never in config, argv or unit text).",
        required=True,
        example="/etc/llamanix/gateway.key",
    ),
    Field(
        "version",
        STR,
        "The LiteLLM release to run (1.82.7 and 1.82.8 are refused).",
        LITELLM_VERSION,
        text="version",
    ),
    Field(
        "routing_strategy",
        ENUM,
        "How LiteLLM picks a replica of a model group (router_settings.routing_strategy).",
        "simple-shuffle",
        ROUTING_STRATEGIES,
    ),
    Field(
        "retries",
        INT,
        "Retries of a failed request on the group's replicas (router_settings.num_retries).",
        8,
        minimum=0,
        maximum=100,
    ),
    Field(
        "health_check_interval",
        INT,
        "Seconds between the gateway's checks of each replica's /health (no completion, no "
        "slot, no router member loaded), whose verdicts steer routing.",
        5,
        minimum=1,
        maximum=MAX_SECONDS,
    ),
    Field(
        "affinity",
        BOOL,
        "Keep each conversation on the replica that served its last turn, where its prompt is "
        "cached; new conversations go to the least loaded replica (docs/gateway.md). Off: "
        "routing_strategy alone picks among the healthy replicas.",
        True,
    ),
    Field(
        "no_affinity",
        LIST_STR,
        "Model groups (aliases) routed by routing_strategy alone, while affinity is on for "
        "the others.",
        [],
        text="alias",
    ),
    Field(
        "conversations",
        INT,
        "How many conversations the gateway remembers the replica of (the least recently "
        "used is forgotten first; a forgotten one costs one cold turn).",
        4096,
        minimum=1,
        maximum=1_000_000,
    ),
)

# Each host's exporter (llamanix-exporter.service) and what Prometheus is told about it
# (docs/observability.md). The default port is one no other llamanix service takes.
METRICS_FIELDS: tuple[Field, ...] = (
    Field(
        "listen",
        STR,
        "Address each host's exporter (llamanix-exporter.service) listens on; loopback keeps it "
        "to a Prometheus on the same machine.",
        "127.0.0.1",
        text="listen",
    ),
    Field(
        "allow_remote",
        BOOL,
        "Let the exporter listen on an address other than loopback. It serves every instance's "
        "metrics, keyed ones included, to whoever reaches `listen` and `port`, without a key: "
        "a `listen` beyond loopback is refused unless this says so.",
        False,
    ),
    Field("port", INT, "Port of each host's exporter.", 9465, minimum=1, maximum=65535),
    Field(
        "scrape_interval",
        INT,
        "Seconds between Prometheus scrapes of the exporters (the rendered scrape config).",
        15,
        minimum=1,
        maximum=3600,
    ),
    Field(
        "min_ceiling_share",
        FLOAT,
        "Alert when a busy instance decodes below this share of its bandwidth ceiling (the "
        "host's `gpu` and the model file give the ceiling).",
        0.25,
        minimum=0.0,
        maximum=1.0,
    ),
    Field(
        "min_acceptance_share",
        FLOAT,
        "Alert when an instance's draft acceptance falls below this share of the acceptance its "
        "bench gate measured when it kept the generation.",
        0.8,
        minimum=0.0,
        maximum=1.0,
    ),
)

INSTANCE_FIELDS: tuple[Field, ...] = (
    Field(
        "host",
        STR,
        "Name of the host (a [hosts.NAME] table) this instance runs on.",
        text="name",
    ),
    Field(
        "variant",
        ENUM,
        "Which llama.cpp build serves this instance.",
        "upstream",
        VARIANT_NAMES,
    ),
    Field(
        "binary",
        PATH,
        "Explicit llama-server path; overrides the host's `binaries` entry for the variant.",
        text="program",
    ),
    Field("model", PATH, "Absolute path of the GGUF model.", required=True),
    Field(
        "alias",
        STR,
        "Model name the OpenAI API reports and accepts (-a).",
        example="qwen",
        text="alias",
    ),
    Field("listen", STR, "Address to listen on.", "127.0.0.1", text="listen"),
    Field("port", INT, "TCP port.", 8080, minimum=1, maximum=MAX_PORT),
    Field(
        "context",
        INT,
        "Context size in tokens (-c).",
        example=131072,
        minimum=1,
        maximum=MAX_TOKENS,
    ),
    Field(
        "gpu_layers",
        LAYERS,
        'Layers offloaded to the GPU (-ngl): integer, "all" or "auto".',
        minimum=0,
        maximum=MAX_LAYERS,
    ),
    Field("flash_attn", ENUM, "Flash attention (-fa).", values=FLASH_ATTN),
    Field("cache_type_k", ENUM, "K cache type (-ctk).", values=ALL_CACHE_TYPES),
    Field(
        "cache_type_v",
        ENUM,
        "V cache type (-ctv); quantized V needs flash attention.",
        values=ALL_CACHE_TYPES,
    ),
    Field("parallel", INT, "Server slots (-np).", minimum=1, maximum=MAX_SLOTS),
    Field("batch", INT, "Logical batch size (-b).", minimum=1, maximum=MAX_TOKENS),
    Field("ubatch", INT, "Physical batch size (-ub).", minimum=1, maximum=MAX_TOKENS),
    Field("threads", INT, "CPU threads (-t).", minimum=1, maximum=MAX_THREADS),
    Field(
        "jinja",
        BOOL,
        "Use the model's jinja chat template (needed for tool calls). Rendered explicitly "
        "where a variant's default differs (ik defaults to off).",
        True,
    ),
    Field(
        "reasoning_budget",
        INT,
        "Reasoning token budget (-1 unrestricted).",
        minimum=-1,
        maximum=MAX_TOKENS,
    ),
    Field("metrics", BOOL, "Expose Prometheus /metrics.", True),
    Field(
        "warm_switch",
        BOOL,
        "Keep the slots' prompt caches across a switch that keeps the model, context layout and "
        "KV-cache type: saved to the unit's state directory before the restart "
        "(--slot-save-path), restored before the port opens again.",
        False,
    ),
    Field(
        "api_key_file",
        PATH,
        "File holding the API key; passed as a systemd credential, never in argv or unit text. "
        "As llama-server reads it: one key per line, empty and `#` lines skipped; llamanix's "
        "own clients (readiness, gates, bench, top, the exporter) use the first.",
    ),
    Field(
        "keyless",
        BOOL,
        "Serve on a `listen` beyond loopback without `api_key_file`, on purpose: anyone who "
        "reaches the port can use the server. Without it, validate refuses such a listener.",
        False,
    ),
    Field(
        "extra_args",
        LIST_STR,
        "Arguments appended verbatim (checked against a probe).",
        [],
        text="word",
    ),
    Field(
        "environment",
        DICT_STR,
        "Extra environment variables for the service.",
        {},
        text="text",
        keys="env_name",
    ),
)

SPECULATIVE_FIELDS: tuple[Field, ...] = (
    Field(
        "type",
        ENUM_LIST,
        "Speculative decoding mode, or a chain of them (a list, e.g. "
        '["ngram-mod", "mtp"]: at most one drafter, rendered as the binary spells a chain). '
        "The parameters below apply to the first type.",
        "none",
        SPEC_TYPES,
    ),
    Field("draft_model", PATH, "Absolute path of the draft GGUF (draft, dflash, dspark, eagle3)."),
    Field(
        "draft_gpu_layers",
        LAYERS,
        'Draft layers on the GPU: integer, "all" or "auto".',
        minimum=0,
        maximum=MAX_LAYERS,
    ),
    Field(
        "draft_cache_type_k",
        ENUM,
        "The drafter's K cache type (-ctkd); needs a drafter in the chain.",
        values=ALL_CACHE_TYPES,
    ),
    Field(
        "draft_cache_type_v",
        ENUM,
        "The drafter's V cache type (-ctvd); needs a drafter in the chain.",
        values=ALL_CACHE_TYPES,
    ),
    Field(
        "draft_device",
        STR,
        "Devices for the drafter (-devd), comma-separated as --list-devices names them, or "
        '"none"; not in ik.',
        example="CUDA1",
        text="devices",
    ),
    Field(
        "draft_cpu_moe",
        BOOL,
        "Keep the drafter's MoE expert weights on the CPU (-cmoed); not in ik.",
    ),
    Field("n_max", INT, "Maximum tokens drafted per step.", minimum=0, maximum=MAX_DRAFT),
    Field("n_min", INT, "Minimum tokens drafted per step.", minimum=0, maximum=MAX_DRAFT),
    Field("p_min", FLOAT, "Minimum draft probability to keep drafting.", minimum=0.0, maximum=1.0),
    Field(
        "draft_ctx_size",
        INT,
        "Context of the drafter (beellama: --spec-draft-ctx-size; DFlash defaults to 256).",
        minimum=0,
        maximum=MAX_TOKENS,
    ),
    Field(
        "dflash_max_slots",
        INT,
        "DFlash only (beellama): slots that keep DFlash state (default 1); parallel may not "
        "exceed it.",
        minimum=1,
        maximum=MAX_SLOTS,
    ),
    Field(
        "dflash_cross_ctx",
        INT,
        "DFlash only (beellama): target hidden states the drafter attends to (default 512).",
        minimum=1,
        maximum=MAX_TOKENS,
    ),
)

HOSTS = {f.name: f for f in HOST_FIELDS}
ROUTER = {f.name: f for f in ROUTER_FIELDS}
GATEWAY = {f.name: f for f in GATEWAY_FIELDS}
METRICS = {f.name: f for f in METRICS_FIELDS}
# Keys a host table may hold besides its fields.
HOST_TABLES = ("router",)
INSTANCE = {f.name: f for f in INSTANCE_FIELDS}
SPECULATIVE = {f.name: f for f in SPECULATIVE_FIELDS}
# Keys an instance table may hold besides its fields.
INSTANCE_TABLES = ("speculative",)
TOP_LEVEL = ("defaults", "hosts", "instances", "gateway", "metrics")


# The type of the names of [hosts.NAME] and [instances.NAME] tables.
TABLE_NAME: TextKind = "name"
# Unit names llamanix derives besides an instance's own (llamanix-NAME.service): an instance may
# not take one. A blue-green switch's bridge of instance NAME is llamanix-NAME-bridge.service,
# so no instance name ends in the bridge's suffix: a bridge can never be another instance.
# `fleet` is the fleet agent's own transient unit (llamanix-fleet.service) and `gateway-keys`
# the NixOS gateway's key unit (llamanix-gateway-keys.service).
RESERVED_NAMES = ("router", "gateway", "exporter", "fleet", "gateway-keys")
BRIDGE_SUFFIX = "-bridge"


def schema_json() -> JsonObject:
    """The schema as data: what ``data/schema.json`` holds and the NixOS module reads."""
    return {
        "types": types_json(),
        "names": {
            "type": TABLE_NAME,
            "reserved": [*RESERVED_NAMES],
            "reserved_suffix": BRIDGE_SUFFIX,
        },
        "hosts": {f.name: f.to_json() for f in HOST_FIELDS},
        "router": {f.name: f.to_json() for f in ROUTER_FIELDS},
        "gateway": {f.name: f.to_json() for f in GATEWAY_FIELDS},
        "metrics": {f.name: f.to_json() for f in METRICS_FIELDS},
        "instances": {f.name: f.to_json() for f in INSTANCE_FIELDS},
        "speculative": {f.name: f.to_json() for f in SPECULATIVE_FIELDS},
    }


def schema_json_text() -> str:
    return json.dumps(schema_json(), indent=2, sort_keys=False) + "\n"


def _markdown_default(f: Field) -> str:
    if f.default is None:
        return "absent"
    return "`" + json.dumps(f.default) + "`"


def _markdown_type(f: Field) -> str:
    if f.kind == ENUM_LIST:
        return "one of " + ", ".join(f"`{v}`" for v in f.values) + ", or a list of them"
    if f.kind == ENUM:
        return " \\| ".join(f"`{v}`" for v in f.values) if f.name != "variant" else ("variant name")
    bounds = ""
    if f.minimum is not None and f.maximum is not None:
        bounds = f" {_markdown_number(f.minimum)} to {_markdown_number(f.maximum)}"
    text = f" ([{f.text}](#strings))" if f.text and f.kind != PATH else ""
    keys = f" keyed by [{f.keys}](#strings)" if f.keys else ""
    return {
        STR: "string",
        INT: "integer" + bounds,
        FLOAT: "number" + bounds,
        BOOL: "boolean",
        PATH: "absolute path" if f.text == "path" else f"absolute path ([{f.text}](#strings))",
        LAYERS: f'integer{bounds}, `"all"`, `"auto"`',
        LIST_STR: "list of strings",
        DICT_STR: "table of strings" + keys,
    }[f.kind] + text


def _markdown_number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def schema_markdown() -> str:
    """The config reference table of docs/configuration.md (a test keeps the two equal)."""
    out: list[str] = []
    for title, fields in (
        ("`[hosts.NAME]`", HOST_FIELDS),
        ("`[hosts.NAME.router]`", ROUTER_FIELDS),
        ("`[gateway]`", GATEWAY_FIELDS),
        ("`[metrics]`", METRICS_FIELDS),
        ("`[instances.NAME]` (and `[defaults]`)", INSTANCE_FIELDS),
        ("`[instances.NAME.speculative]`", SPECULATIVE_FIELDS),
    ):
        out += [f"### {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in fields:
            req = " **required**" if f.required else ""
            out.append(
                f"| `{f.name}` | {_markdown_type(f)} | {_markdown_default(f)} | {f.doc}{req} |"
            )
        out.append("")
    out += [
        "### Strings",
        "",
        f"Every name and string has one of these types. The names of `[hosts.NAME]` and "
        f"`[instances.NAME]` tables are of type `{TABLE_NAME}`; an instance may "
        "not be named " + ", ".join(f"`{n}`" for n in RESERVED_NAMES) + f" or end in "
        f"`{BRIDGE_SUFFIX}` (docs/security.md says why). A NUL byte is refused everywhere, and "
        "lengths are in bytes of UTF-8.",
        "",
        "| type | what it holds | at most | e.g. |",
        "|---|---|---|---|",
    ]
    for kind, t in TYPES.items():
        example = ", ".join(f"`{g}`" for g in t.good[:3] if g)
        out.append(f"| `{kind}` | {t.doc} | {t.max_length} | {example} |")
    out.append("")
    return "\n".join(out)
