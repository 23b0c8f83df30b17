"""The shape of JSON that llamanix writes: ``--json`` output, state files and records.

``JsonObject`` is what a ``to_json`` returns and what a command prints with ``--json``. What we
read back from disk or from a server is a ``JsonValue`` (the bounded reader's ``parse_json``) or
``object``, narrowed where it is read, until ``json_fields`` or the codec has checked it.
"""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"
