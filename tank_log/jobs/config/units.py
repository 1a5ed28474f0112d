"""The value types of the job configuration, in the broker's grammar (docs/FORMAT.md §1.5), as pydantic types:
durations (`30s`, `15min`, `1h+30min`, `7days`; a bare number is seconds), sizes (`512b`, `64kb`, `1gb`; a bare
number is bytes), and the strict scalars whose errors say what was expected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, WithJsonSchema
from pydantic_core import core_schema

from tank_log.errors import JobConfigError
from tank_log.format.broker_config import parse_duration, parse_size

DURATION_HELP = "a duration: 30s, 15min, 2h, 7days, 1week (a number: seconds)"
SIZE_HELP = "a size: 512b, 64kb, 256mb, 1gb (a number: bytes)"


def duration_ms(value: Any) -> int:
    """Raises:
    ValueError: not a duration.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 1000
    if isinstance(value, str):
        try:
            return parse_duration(value) * 1000
        except ValueError as err:
            raise ValueError(f"{err} (broker duration units: 30s, 15min, 2h, 7days, 1week)") from None
    raise ValueError(f"expected a duration such as 7days, got {value!r}")


def size_bytes(value: Any) -> int:
    """Raises:
    ValueError: not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as err:
            raise ValueError(f"{err} (broker size units: 512b, 64kb, 256mb, 1gb)") from None
    raise ValueError(f"expected a size such as 64kb, got {value!r}")


def _strict_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {value!r}")


def _count(lo: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= lo:
            return value
        raise ValueError(f"expected an integer >= {lo}, got {value!r}")

    return check


def _ratio(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)
    raise ValueError(f"expected a number within [0, 1], got {value!r}")


def _text(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise ValueError(f"expected a non-empty string, got {value!r}")


class OneOf:
    """Metadata of a string among fixed choices (any case): `Annotated[str, OneOf("a", "b")]`."""

    def __init__(self, *choices: str):
        self.choices = choices

    def check(self, value: Any) -> str:
        if isinstance(value, str) and value.lower() in self.choices:
            return value.lower()
        raise ValueError(f"expected one of {', '.join(self.choices)}, got {value!r}")

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(d, str) and d for d in value):
        raise ValueError("expected a list of paths")
    return tuple(value)


def _string_map(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


def keyed_by_name(value: Any) -> Any:
    """A mapping whose keys are names (topics: YAML reads `123:` as a number)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


Millis = Annotated[
    int, BeforeValidator(duration_ms), WithJsonSchema({"type": ["string", "integer"], "description": DURATION_HELP})
]
Seconds = Annotated[
    int,
    BeforeValidator(lambda v: duration_ms(v) // 1000),
    WithJsonSchema({"type": ["string", "integer"], "description": DURATION_HELP}),
]
Size = Annotated[
    int, BeforeValidator(size_bytes), WithJsonSchema({"type": ["string", "integer"], "description": SIZE_HELP})
]
Flag = Annotated[bool, BeforeValidator(_strict_bool), WithJsonSchema({"type": "boolean"})]
Count = Annotated[int, BeforeValidator(_count(0)), WithJsonSchema({"type": "integer", "minimum": 0})]
Positive = Annotated[int, BeforeValidator(_count(1)), WithJsonSchema({"type": "integer", "minimum": 1})]
Ratio = Annotated[float, BeforeValidator(_ratio), WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1})]
Text = Annotated[str, BeforeValidator(_text), WithJsonSchema({"type": "string", "minLength": 1})]
Paths = Annotated[
    tuple[str, ...],
    BeforeValidator(_paths),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
]
StringMap = Annotated[
    dict[str, str],
    BeforeValidator(_string_map),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}),
]


def parse_duration_ms(value: str, where: str) -> int:
    """A command-line duration in the broker's grammar, in ms.

    Raises:
        JobConfigError: naming `where`.
    """
    try:
        return duration_ms(value)
    except ValueError as err:
        raise JobConfigError(f"{where}: {err}") from None


def parse_size_arg(value: str, where: str) -> int:
    """A command-line size in the broker's grammar, in bytes.

    Raises:
        JobConfigError: naming `where`.
    """
    try:
        return size_bytes(value)
    except ValueError as err:
        raise JobConfigError(f"{where}: {err}") from None
