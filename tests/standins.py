"""Recording stand-ins for programs that cannot run here (nixos-rebuild, nix, systemctl,
nvidia-smi, cuobjdump, journalctl): the one helper every test uses for them.

A stand-in only appends its argv and working directory to a JSON-lines record, prints a
recorded output if it has one, and exits with ``$STANDIN_EXIT_<name>`` (default 0), so a test
can assert the exact command lines llamanix runs and feed its parsers real-shaped text.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

_SCRIPT = """#!{python}
import json, os, sys
with open({record!r}, "a") as fh:
    fh.write(json.dumps({{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                         "cwd": os.getcwd()}}) + "\\n")
output = {output!r}
if output:
    with open(output) as fh:
        sys.stdout.write(fh.read())
name = os.path.basename(sys.argv[0]).replace("-", "_")
sys.exit(int(os.environ.get("STANDIN_EXIT_" + name, "0")))
"""


def stand_in(
    bin_dir: Path, name: str, output_file: Path | None = None, record: Path | None = None
) -> Path:
    """Write the stand-in ``bin_dir/name``; returns its record (default ``bin_dir/name.jsonl``,
    or ``record``, which several stand-ins may share to keep their calls in order)."""
    bin_dir.mkdir(exist_ok=True)
    record = record or bin_dir / f"{name}.jsonl"
    script = bin_dir / name
    script.write_text(
        _SCRIPT.format(
            python=sys.executable,
            record=str(record),
            output=str(output_file) if output_file else "",
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return record


def recorded(record: Path) -> list[dict[str, object]]:
    """Every call, in order: {"argv": [NAME, ARG...], "cwd": DIR}."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def recorded_argv(record: Path) -> list[str]:
    """The argv of the last call."""
    argv = recorded(record)[-1]["argv"]
    assert isinstance(argv, list)
    return [str(a) for a in argv]


# A build for another CPU, for real: it hands --help/--version to the real llama-server (the probe
# passes, as it does for such a build) and otherwise executes an instruction the CPU refuses
# (ud2, through __builtin_trap), so the kernel sends it a real SIGILL, as on the first batch of
# AMX code on a VM that advertises AMX and cannot run it.
_SIGILL_SOURCE = r"""
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "--version")) {
            argv[0] = REAL;
            execv(REAL, argv);
            return 127;
        }
    }
    __builtin_trap();
}
"""


def build_sigill_server(real: str, out: Path) -> Path:
    """Compile the SIGILL stand-in at ``out``; ``real`` is the llama-server that answers for it
    (its path where the stand-in runs: a test host's, or this machine's)."""
    source = out.with_name(out.name + ".c")
    source.write_text(_SIGILL_SOURCE)
    subprocess.run(
        ["cc", "-O0", f'-DREAL="{real}"', "-o", str(out), str(source)], check=True, timeout=120
    )
    return out
