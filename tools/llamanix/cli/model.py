"""llamanix CLI: ``model``, figures of a model file and a GPU, no server needed: ``model
inspect`` (what a GGUF holds) and ``model ceiling`` (the decode roofline)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from llamanix.cli.console import console as make_console
from llamanix.cli.console import count, echo_json, size
from llamanix.cli.options import FILE, json_flag
from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import load_gpus
from llamanix.model.ceiling import ceiling_for, decode_ceiling_tok_s, find_gpu, parse_bytes
from llamanix.model.gguf_info import CACHE_TYPES, GgufInfo, read_gguf


def _inspect_table(info: GgufInfo) -> Table:
    table = Table(title=info.path, title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    mix = ", ".join(
        f"{k} {v.bytes / max(info.tensor_bytes, 1):.0%} ({v.count})"
        for k, v in info.tensor_types.items()
    )
    rows = [
        ("architecture", info.architecture + (f" ({info.name})" if info.name else "")),
        ("parameters", count(info.parameter_count)),
        ("file size", f"{size(info.file_bytes)} (tensors {size(info.tensor_bytes)})"),
        ("tensor types", mix or "-"),
        ("vocabulary", f"{info.vocab_size} ({info.tokenizer_model or '?'})"),
        ("training context", str(info.context_length or "-")),
        (
            "layers",
            f"{info.block_count} ({info.attention_layers} attention, "
            f"{info.recurrent_layers} recurrent, {info.nextn_layers} MTP)",
        ),
        ("heads / KV heads", f"{info.head_count or '-'} / {info.head_count_kv or '-'}"),
        ("head dims (K/V)", f"{info.head_dim_k or '-'} / {info.head_dim_v or '-'}"),
    ]
    if info.expert_count:
        rows.append(("experts", f"{info.expert_used_count} of {info.expert_count} per token"))
    if info.sliding_window:
        rows.append(("sliding window", str(info.sliding_window)))
    rows.append(
        (
            "KV bytes / token",
            ", ".join(
                f"{t} {size(info.kv_bytes_per_token(t, t))}" for t in ("f16", "q8_0", "q4_0")
            ),
        )
    )
    if info.recurrent_state_bytes:
        rows.append(("recurrent state / slot", size(info.recurrent_state_bytes)))
    rows.append(("MTP (nextn) layers", "yes" if info.has_mtp else "no"))
    rows.append(
        (
            "hybrid / recurrent",
            "hybrid" if info.is_hybrid else ("recurrent" if info.is_recurrent else "no"),
        )
    )
    rows.append(("weights read / token", size(info.weight_bytes_per_token())))
    for key, value in rows:
        table.add_row(key, value)
    return table


@click.command("inspect")
@click.argument("model", type=FILE)
@json_flag
def inspect_cmd(model: Path, as_json: bool) -> None:
    """What a GGUF holds: architecture, sizes, layers, KV cost per token, MTP, hybrid."""
    info = read_gguf(model)
    if as_json:
        echo_json(info.to_json())
        return
    console = make_console()
    console.print(_inspect_table(info))
    kv = Table(title="KV cache per token (K and V of one type)", title_justify="left")
    kv.add_column("cache type")
    kv.add_column("bytes/token", justify="right")
    kv.add_column("at training context", justify="right")
    for t in CACHE_TYPES:
        per = info.kv_bytes_per_token(t, t)
        kv.add_row(t, f"{per:,.0f}", size(per * (info.context_length or 0)))
    console.print(kv)


# --- ceiling --------------------------------------------------------------------------------


def _gpu_table() -> Table:
    table = Table(title="GPU table (llamanix/data/gpus.toml)", title_justify="left")
    for heading in ("name", "label", "bandwidth GB/s", "memory GiB", "compute capability"):
        table.add_column(heading)
    for g in load_gpus().values():
        table.add_row(
            g.name, g.label, f"{g.bandwidth_gb_s:g}", f"{g.memory_gib:g}", g.compute_capability
        )
    return table


@click.command("ceiling")
@click.option("--gpu", help="GPU from the table (see --list).")
@click.option("--bandwidth", type=float, help="Memory bandwidth in GB/s (10^9 bytes/s).")
@click.option(
    "--model",
    "model",
    type=FILE,
    help="GGUF whose weights are read per token.",
)
@click.option("--bytes", "bytes_text", help="Bytes read per token: 15300000000, 15.3e9, 15.3GB.")
@click.option(
    "--active-fraction",
    type=float,
    help="Share of the weights read per token (MoE: active/total parameters).",
)
@click.option("--list", "show_list", is_flag=True, help="Show the GPU table.")
@json_flag
def ceiling_cmd(
    gpu: str | None,
    bandwidth: float | None,
    model: Path | None,
    bytes_text: str | None,
    active_fraction: float | None,
    show_list: bool,
    as_json: bool,
) -> None:
    """The decode roofline: memory bandwidth / bytes read per token."""
    if show_list:
        if as_json:
            echo_json({name: vars(g) for name, g in load_gpus().items()})
        else:
            make_console().print(_gpu_table())
        return
    if (gpu is None) == (bandwidth is None):
        raise UserError(
            Problem(
                "llamanix model ceiling",
                "--gpu/--bandwidth",
                "give exactly one",
                "pass --gpu NAME (see --list) or --bandwidth GB/s",
            )
        )
    if (model is None) == (bytes_text is None):
        raise UserError(
            Problem(
                "llamanix model ceiling",
                "--model/--bytes",
                "give exactly one",
                "pass --model FILE.gguf or --bytes 15.3GB",
            )
        )
    if bandwidth is not None and bandwidth <= 0:
        raise UserError(
            Problem(
                "llamanix model ceiling",
                "--bandwidth",
                "must be positive",
                "give the card's memory bandwidth in GB/s",
            )
        )
    if active_fraction is not None and not 0 < active_fraction <= 1:
        raise UserError(
            Problem(
                "llamanix model ceiling",
                "--active-fraction",
                f"{active_fraction} is not in (0, 1]",
                "give active/total parameters, e.g. 0.1",
            )
        )
    table_gpu = find_gpu(gpu, "llamanix model ceiling") if gpu else None
    bw = table_gpu.bandwidth_gb_s if table_gpu else float(bandwidth or 0)
    if model is not None:
        info = read_gguf(model)
        per_token = info.weight_bytes_per_token(active_fraction)
    else:
        per_token = parse_bytes(str(bytes_text)) * (active_fraction or 1.0)
    result = ceiling_for(
        bw,
        per_token,
        gpu=table_gpu.name if table_gpu else None,
        model=str(model) if model else None,
        active_fraction=active_fraction,
    )
    if as_json:
        echo_json(result.to_json())
        return
    source = f"{table_gpu.label}, {bw:g} GB/s" if table_gpu else f"{bw:g} GB/s"
    click.echo(
        f"{source} / {per_token / 1e9:.2f} GB per token = "
        f"{decode_ceiling_tok_s(bw, per_token):.0f} tok/s decode ceiling"
    )


@click.group("model")
def model_group() -> None:
    """What a GGUF holds (inspect), and the decode roofline it allows on a GPU (ceiling)."""


model_group.add_command(inspect_cmd)
model_group.add_command(ceiling_cmd)


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(model_group)
