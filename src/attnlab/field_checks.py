"""A value against the type its dataclass field or constructor argument declares: one line naming the key.

Below the dataclasses that check themselves (``ModelConfig`` reads a config.json or a record, data from a file) and
below ``config_checks``, which checks every key a run reads with the same rules.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

from attnlab.errors import ConfigError, require


def non_finite(value: Any) -> bool:
    """Whether ``value`` is, or holds (lists, mappings), a NaN or an infinity."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(non_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(non_finite(item) for item in value)
    return False


def describe(annotation: Any) -> str:
    """``int``, ``float | None``, ``list[str]``: an annotation as the user reads it."""
    name = getattr(annotation, "__name__", None)
    if name and not typing.get_args(annotation):
        return name
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def check_value(value: Any, annotation: Any, key: str) -> None:
    """``value`` against ``annotation`` (pydantic's lax mode; every number finite: no option of a model, a variant,
    the data or a callback means anything at NaN or infinity); an annotation pydantic cannot check is skipped."""
    from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(annotation)
    except (PydanticSchemaGenerationError, TypeError, NameError):
        return
    try:
        validated = adapter.validate_python(value)
    except ValidationError:
        raise ConfigError(key, f"must be {describe(annotation)}, got {value!r}") from None
    require(not non_finite(validated), key, f"must be a finite number, got {value!r}")


def check_fields(values: Mapping[str, Any], cls: type, prefix: str) -> None:
    """Each of ``values`` whose name is a field of the dataclass ``cls``, against the field's type."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in values and field.name in hints:
            check_value(values[field.name], hints[field.name], f"{prefix}.{field.name}" if prefix else field.name)
