"""A host's instances as the exporter and ``top`` read them: where each one's /metrics is, its
labels, its key and its decode ceiling.

The labels come from the config (variant, model file, speculative type) and the build from the
server itself (``/props``), else from the serving generation's manifest (the probe's commit at
render time). A router's members are read through the router (``observe.scrape``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llamanix.config.model import Config, Instance
from llamanix.core.address import connect_url
from llamanix.core.api_key import read_api_key
from llamanix.core.errors import UserError
from llamanix.core.gpus import load_gpus
from llamanix.observe.scrape import Endpoint
from llamanix.render.exporter_unit import ROUTER_KEY, key_credential
from llamanix.render.router import served_name
from llamanix.state.generations import HostState


@dataclass(frozen=True)
class MetricsTarget:
    instance: str
    endpoint: Endpoint
    labels: Mapping[str, str]  # every target label but the build
    key_owner: str | None  # whose key file opens the endpoint: the instance, "router", or none
    key_file: str | None
    manifest_build: str | None
    ceiling_tok_s: float | None
    ceiling_note: str | None = None  # why there is no ceiling, when the host names a GPU

    @property
    def client_key(self) -> tuple[str, str | None]:
        """Targets that share an address and a key share one HTTP client (a router's)."""
        return self.endpoint.url, self.key_owner


def _model_label(inst: Instance) -> str:
    return Path(inst.model).name.removesuffix(".gguf")


def _ceiling(config: Config, inst: Instance) -> tuple[float | None, str | None]:
    gpu = config.hosts[inst.host].gpu
    if gpu is None:
        return None, None
    from llamanix.model.ceiling import decode_ceiling_tok_s
    from llamanix.model.gguf_weights import weight_table

    try:
        table = weight_table(Path(inst.model))
    except UserError as err:
        return None, f"no ceiling for {inst.name}: {err}"
    bandwidth = load_gpus()[gpu].bandwidth_gb_s
    return decode_ceiling_tok_s(bandwidth, table.weight_bytes_per_token()), None


def serving_builds(state: HostState) -> dict[str, str]:
    """Each instance's source revision in the serving generation's manifest, where recorded."""
    current = state.current()
    if current is None:
        return {}
    manifest = current.render_files().manifest
    if manifest is None:
        return {}
    return {
        name: entry.source_revision
        for name, entry in manifest.instances.items()
        if entry.source_revision
    }


def host_targets(config: Config, host: str, builds: Mapping[str, str]) -> list[MetricsTarget]:
    """Every instance of ``host`` (a router's members through the router), by name."""
    router = config.hosts[host].router
    members = router.members if router is not None else ()
    out: list[MetricsTarget] = []
    for inst in sorted(config.instances_on(host), key=lambda i: i.name):
        if router is not None and inst.name in members:
            endpoint = Endpoint(
                connect_url(router.listen, router.port), served_name(inst), router.kind
            )
            key_owner, key_file = (
                (ROUTER_KEY, router.api_key_file) if router.api_key_file else (None, None)
            )
        else:
            endpoint = Endpoint(connect_url(inst.listen, inst.port))
            key_owner, key_file = (
                (inst.name, inst.api_key_file) if inst.api_key_file else (None, None)
            )
        ceiling, note = _ceiling(config, inst)
        out.append(
            MetricsTarget(
                instance=inst.name,
                endpoint=endpoint,
                labels={
                    "host": host,
                    "instance": inst.name,
                    "variant": inst.variant,
                    "model": _model_label(inst),
                    "spec_type": inst.speculative.label,
                },
                key_owner=key_owner,
                key_file=key_file,
                manifest_build=builds.get(inst.name),
                ceiling_tok_s=ceiling,
                ceiling_note=note,
            )
        )
    return out


def read_target_key(target: MetricsTarget) -> str | None:
    """The key that opens the target: from the exporter unit's credentials where it runs as
    one, else from the key file the config names. UserError when it cannot be read."""
    if target.key_owner is None or target.key_file is None:
        return None
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials:
        handed = Path(credentials) / key_credential(target.key_owner)
        if handed.is_file():
            return read_api_key(handed, "LoadCredential")
    field = "api_key_file"
    return read_api_key(Path(target.key_file), field)
