"""The recorded --help texts of tests/data/help as probes, and the one derived text (clearly
not a recording) that stands for a BeeLlama newer than the recorded v0.3."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from cli_run import run_llamanix

from llamanix.core.probe import Capabilities, parse_capabilities

HELP = Path(__file__).parent / "data" / "help"
# scripts/nix-real-lib names a recording of tests/data/help here when no llama-server is built:
# the render tests then check against that recorded probe instead of starting a build.
RECORDED_PROBE = os.environ.get("LLAMANIX_RECORDED_PROBE", "")


def recorded(name: str) -> Capabilities:
    return parse_capabilities(
        f"recorded:{name}",
        (HELP / f"{name}.version.txt").read_text(),
        (HELP / f"{name}.help.txt").read_text(),
    )


UPSTREAM, IK_PIN, IK_NEW, BEE03, B8770 = (
    "upstream-0c1e570",
    "ik-de55d9e2",
    "ik-8337e4cd",
    "beellama-ba1fdce",
    "b8770-f49e917",
)


def bee_after_v03() -> Capabilities:
    """NOT a recording: the BeeLlama v0.3 recording with only the three changes its tracker
    names for v0.4 applied (#98: DFlash is ``draft-dflash``; #97: ``-cd`` is gone; #120: -ctk
    lists no KVarN type, -ctv lists kvarn2..kvarn8 and no turbo*). No v0.4 source could be
    fetched here; this exercises the fallback an unrecorded BeeLlama takes."""
    text = (HELP / f"{BEE03}.help.txt").read_text()
    text = text.replace("|recycle|dflash]", "|recycle|draft-dflash]")
    text = re.sub(r"--spec-draft-ctx-size, -cd, --ctx-size-draft N\n(?: {20,}.*\n)+", "", text)
    turbo = "q5_1,\n" + " " * 40 + "turbo2, turbo3, turbo4, turbo3_tcq, turbo2_tcq"
    assert text.count(turbo) >= 2
    k_list = "q5_1"
    v_list = (
        "q5_1,\n                                        q6_0, q6_1, q3_0, q3_1, q2_0, q2_1, "
        "kvarn2, kvarn3, kvarn4, kvarn5,\n                                        kvarn6, kvarn8"
    )
    head, _, tail = text.partition("-ctv,  --cache-type-v TYPE")
    text = (
        head.replace(turbo, k_list, 1)
        + "-ctv,  --cache-type-v TYPE"
        + tail.replace(turbo, v_list, 1)
    )
    return parse_capabilities("derived:beellama-after-v0.3", "version: 0 (unknown)", text)


def write_probe(caps: Capabilities, path: Path) -> Path:
    """The probe as `llamanix variant probe BINARY --json` writes it, for --capabilities."""
    path.write_text(json.dumps(caps.to_json(), indent=1) + "\n")
    return path


def probe_of(binary: Path, path: Path) -> Path:
    """What `llamanix variant probe BINARY --json` writes, run for real, as a file at ``path``."""
    proc = run_llamanix("variant", "probe", str(binary), "--json", timeout=None)
    assert proc.returncode == 0, proc.stderr
    path.write_text(proc.stdout)
    return path
