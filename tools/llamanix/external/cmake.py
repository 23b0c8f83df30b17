"""cmake, for the test bed's llama-server build: configure a source tree, build targets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def configure_argv(src: Path, build: Path, options: Sequence[str]) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), *options]


def build_argv(build: Path, targets: Sequence[str], jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--target", *targets, f"-j{jobs}"]
