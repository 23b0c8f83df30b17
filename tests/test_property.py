"""Random and mutated configs never produce a traceback: a Config, or a UserError."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamanix.config.argv import instance_argv
from llamanix.config.model import parse_config
from llamanix.core import schema
from llamanix.core.errors import UserError
from llamanix.core.variants import VARIANTS
from llamanix.render.units import render_host

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)


def plausible(f: schema.Field) -> st.SearchStrategy[Any]:
    by_kind: dict[str, st.SearchStrategy[Any]] = {
        schema.STR: st.sampled_from(["gpu1", "qwen", "rtx5090", "x"]),
        schema.PATH: st.sampled_from(["/m/a.gguf", "/m/b.gguf", "rel/path.gguf"]),
        schema.INT: st.integers(-2, 70000),
        schema.FLOAT: st.floats(-0.5, 1.5),
        schema.BOOL: st.booleans(),
        schema.ENUM: st.sampled_from([*f.values, *VARIANTS, "bogus"]),
        schema.ENUM_LIST: st.one_of(
            st.sampled_from([*f.values, "bogus"]),
            st.lists(st.sampled_from([*f.values, "bogus"]), max_size=3),
        ),
        schema.LAYERS: st.one_of(st.integers(-1, 999), st.sampled_from(["all", "auto", "most"])),
        schema.LIST_STR: st.lists(
            st.sampled_from(["--no-webui", "--api-key", "-t", "4"]), max_size=3
        ),
        schema.DICT_STR: st.dictionaries(
            st.sampled_from(["A", "LLAMA_API_KEY", "1x"]), st.text(max_size=4), max_size=2
        ),
    }
    return st.one_of(by_kind[f.kind], JUNK) if f.kind != schema.ENUM else by_kind[f.kind]


def table(fields: tuple[schema.Field, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {}, optional={f.name: plausible(f) for f in fields} | {"bogus_key": JUNK}
    )


CONFIGS = st.fixed_dictionaries(
    {
        "instances": st.dictionaries(
            st.sampled_from(["a", "b", "c"]),
            st.tuples(table(schema.INSTANCE_FIELDS), table(schema.SPECULATIVE_FIELDS)).map(
                lambda t: {**t[0], "speculative": t[1]}
            ),
            max_size=3,
        )
    },
    optional={
        "hosts": st.dictionaries(
            st.sampled_from(["gpu1", "x"]), table(schema.HOST_FIELDS), max_size=2
        ),
        "defaults": table(schema.INSTANCE_FIELDS),
        "extra": JUNK,
    },
)


def exercise(data: dict[str, Any]) -> None:
    try:
        cfg = parse_config(data, "fuzz.toml")
    except UserError as err:
        assert err.problems and all(str(p).startswith("fuzz.toml: ") for p in err.problems)
        return
    for name in cfg.instances:
        for variant in VARIANTS:
            try:
                argv = instance_argv(cfg, name, variant=variant)
            except UserError as err:
                assert all(str(p).startswith("fuzz.toml: ") for p in err.problems)
            else:
                assert all(isinstance(a, str) for a in argv)
    for host in cfg.hosts:
        with contextlib.suppress(UserError):
            render_host(cfg, host)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS)
def test_random_configs_never_traceback(data: dict[str, Any]) -> None:
    exercise(data)


VALID: dict[str, Any] = {
    "hosts": {"gpu1": {"kind": "nixos", "gpu": "rtx5090", "cuda_archs": ["12.0"]}},
    "defaults": {"flash_attn": "on"},
    "instances": {
        "a": {
            "host": "gpu1",
            "model": "/m/a.gguf",
            "cache_type_v": "q4_0",
            "speculative": {"type": "draft", "draft_model": "/m/d.gguf", "n_max": 8},
        },
        "b": {"host": "gpu1", "model": "/m/b.gguf", "port": 8081, "variant": "ik"},
    },
}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    return out


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(paths(VALID)[1:]), JUNK, st.booleans())
def test_mutated_configs_never_traceback(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    data = copy.deepcopy(VALID)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    exercise(data)


def test_valid_base_is_valid() -> None:
    parse_config(copy.deepcopy(VALID), "base.toml")
