"""The weight bytes a decode step reads, straight from a GGUF's header: fast enough for ``top``.

``gguf_info.read_gguf`` builds the gguf library's view of every field, which takes seconds on a
262k-token vocabulary (tens of seconds on a busy machine); the exporter and ``llamanix top``
need only the tensor table and two expert counts. This walks the key/value section with
``struct`` over a memory map with ``gguf_header``'s walker, then reads each tensor's shape and type,
and sizes it with the gguf library's own block sizes. The sum follows
``GgufInfo.weight_bytes_per_token`` (a test keeps the two equal).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.model.gguf_header import MAX_NAME, string_at, walk_key_values

# ggml's tensors have 4 dimensions at most; far more is a corrupt file, not a shape.
_MAX_DIMS = 16


@dataclass(frozen=True)
class WeightTable:
    tensor_bytes: int
    token_embd_bytes: int
    output_tied: bool
    expert_tensor_bytes: int
    expert_count: int
    expert_used_count: int

    def weight_bytes_per_token(self) -> float:
        """As ``GgufInfo.weight_bytes_per_token`` (no active fraction)."""
        base = float(self.tensor_bytes)
        if not self.output_tied:
            base -= self.token_embd_bytes
        if self.expert_count > 0 and self.expert_used_count > 0:
            dense = base - self.expert_tensor_bytes
            return dense + self.expert_tensor_bytes * self.expert_used_count / self.expert_count
        return base


def weight_table(path: Path) -> WeightTable:
    """The tensor table of ``path``; UserError naming the file when it is not a readable GGUF."""
    try:
        stat = path.stat()
        return _read_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except OSError as err:
        raise UserError(
            Problem(str(path), "model", f"cannot read: {err.strerror}", "check the path")
        ) from None
    except (ValueError, struct.error, KeyError) as err:
        raise UserError(
            Problem(str(path), "model", f"not a readable GGUF ({err})", "give a .gguf model")
        ) from None


@lru_cache(maxsize=32)
def _read_cached(path: Path, mtime_ns: int, size: int) -> WeightTable:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with (
        file_reader.open_regular(path, source=str(path), field="model") as fh,
        mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        kv = walk_key_values(m, size)
        arch = kv.strings.get("general.architecture", "")
        integers, offset = kv.integers, kv.end
        tensor_bytes = embd = experts = 0
        has_output = False
        for _ in range(kv.n_tensors):
            name, offset = string_at(m, offset, MAX_NAME)
            (n_dims,) = struct.unpack_from("<I", m, offset)
            if n_dims > _MAX_DIMS:
                raise ValueError(f"a tensor of {n_dims} dimensions")
            dims = struct.unpack_from(f"<{n_dims}Q", m, offset + 4)
            offset += 4 + 8 * n_dims
            (ggml_type,) = struct.unpack_from("<I", m, offset)
            offset += 12  # the type, and the data offset
            elements = 1
            for d in dims:
                elements *= d
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            n_bytes = elements // block * type_size
            if n_bytes > size:  # the tensor's data is in this file
                raise ValueError(f"tensor {name} of {n_bytes} bytes in a file of {size}")
            tensor_bytes += n_bytes
            if "_exps" in name:
                experts += n_bytes
            if name == "token_embd.weight":
                embd = n_bytes
            if name == "output.weight":
                has_output = True
    return WeightTable(
        tensor_bytes=tensor_bytes,
        token_embd_bytes=embd,
        output_tied=bool(embd) and not has_output,
        expert_tensor_bytes=experts,
        expert_count=integers.get(f"{arch}.expert_count", 0),
        expert_used_count=integers.get(f"{arch}.expert_used_count", 0),
    )
