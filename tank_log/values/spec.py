"""What a topic's keys or values are (`ValueSpec`), what decoding a batch gives (`Decoded`), the decoder's protocol,
and the batch loop every schema'd format shares: the Confluent wire format's header, per-row errors, Arrow columns."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa

from tank_log.errors import RunFailed, TankFormatError, TankLogError, ValueSchemaError
from tank_log.format.varint import decode_varint

ValueFormatName = Literal["binary", "utf8", "json", "avro", "protobuf"]
WireName = Literal["auto", "confluent", "plain"]

MAGIC = 0  # the Confluent wire format: byte 0 is 0, then the schema id as 4 bytes big-endian, then the payload
HEADER = 5
ALIASES_KEY = b"avro.aliases"  # an Avro field's aliases (a JSON list) in its Arrow field's metadata
NUMBER_KEY = b"protobuf.number"  # a Protobuf field's number in its Arrow field's metadata


@dataclass(frozen=True)
class ValueSpec:
    """What the configuration (or command line) says about a topic's keys or values.

    `schema_file` is the reader's (the table's) schema: `.avsc`; `.desc` (a FileDescriptorSet) or `.proto`; a JSON
    Schema `.json`. `schema_ids` maps Confluent schema ids to the writers' schema files (same format); a registry
    (`registry_url`, the Schema Registry REST API) answers for ids not in the map. `wire`: `confluent` expects the
    5-byte header on every value, `plain` never, `auto` expects it when schema ids or a registry are configured (and
    not otherwise).
    """

    format: ValueFormatName
    schema_file: str | None = None
    message: str | None = None
    schema_ids: Mapping[int, str] = field(default_factory=dict)
    registry_url: str | None = None
    wire: WireName = "auto"
    registry_timeout: float = 10.0  # seconds, per request to the registry

    def __hash__(self) -> int:  # hashable despite the mapping (a key of a cache of decoders)
        ids = tuple(sorted(self.schema_ids.items()))
        return hash((self.format, self.schema_file, self.message, ids, self.registry_url, self.wire))


@dataclass(frozen=True)
class Decoded:
    """One batch decoded: one row per input value. A bad value is a null row of `columns`, True in `bad` and its
    one-line error in `errors`; `schema_ids` is each value's Confluent schema id (null when plain)."""

    columns: pa.StructArray
    bad: np.ndarray
    errors: pa.StringArray
    schema_ids: pa.Int32Array


class ValueDecoder(Protocol):
    """Decodes a batch of raw values into typed columns; `decode` never raises for a bad record (only when the run
    cannot go on: a schema registry that cannot answer raises RegistryUnavailable, a RunFailed)."""

    spec: ValueSpec
    arrow_type: pa.StructType

    def decode(self, values: pa.BinaryArray | pa.LargeBinaryArray) -> Decoded:
        """The batch decoded (see `Decoded`)."""
        ...


def require_file(path: str, what: str) -> str:
    """`path` when it is a readable file; else ValueSchemaError naming it."""
    if not os.path.isfile(path):
        raise ValueSchemaError(f"{path}: {what} not found (no such file)")
    if not os.access(path, os.R_OK):
        raise ValueSchemaError(f"{path}: {what} not readable")
    return path


class WireError(TankLogError):
    """A value's bytes break a rule (its message is the row's error)."""


def zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A Kafka-style zig-zag varint (the Confluent Protobuf message indexes) at `pos`: (value, position after)."""
    try:
        raw, pos = decode_varint(buf, pos)
    except TankFormatError as err:
        raise WireError(f"byte {pos}: {err.message}") from None
    return (raw >> 1) ^ -(raw & 1), pos


class BatchDecoder:
    """The batch loop: `_decode_one(payload, schema_id)` gives a row (a dict Arrow converts to `arrow_type`) or
    raises; the loop reads the wire header, catches each row's error, builds the columns (a row Arrow cannot hold
    is bad too, found row by row only when the batch's conversion fails)."""

    spec: ValueSpec
    arrow_type: pa.StructType
    format_label: str = "value"

    def __init__(self, spec: ValueSpec, fetch: Callable[[int], str] | None = None) -> None:
        """`fetch(id)`: a schema's text from a registry, for ids not in `spec.schema_ids` (raises for an unknown id)."""
        self.spec = spec
        self._fetch = fetch
        self._fetched: set[int] = set()
        self._missing: dict[int, str] = {}  # ids the registry does not have (or holds for another format)
        has_ids = bool(spec.schema_ids) or fetch is not None
        # None: no ids or registry configured (any id decodes with the schema file)
        self._known_ids: Callable[[int], bool] | None = self._known if has_ids else None
        # auto: the header is expected when schema ids or a registry are configured
        self._framed = spec.wire == "confluent" or (spec.wire == "auto" and has_ids)

    def _known(self, schema_id: int) -> bool:
        """Whether a schema id is configured or the registry has it (a registry's error names URL and id)."""
        if schema_id in self.spec.schema_ids or schema_id in self._fetched:
            return True
        if self._fetch is None:
            return False
        if schema_id in self._missing:  # asked once per decoder: not once per value of an unknown id
            raise WireError(self._missing[schema_id])
        try:
            self._fetch(schema_id)
        except WireError as err:
            self._missing[schema_id] = str(err)
            raise
        self._fetched.add(schema_id)
        return True

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        raise NotImplementedError

    def _split(self, value: bytes) -> tuple[bytes, int | None]:
        """(payload, schema id) of one value, by the wire rule of the spec (the id unchecked)."""
        if not self._framed:
            return value, None
        if len(value) < HEADER:
            raise WireError(f"{len(value)} bytes: shorter than the 5-byte Confluent header (magic byte, schema id)")
        if value[0] != MAGIC:
            raise WireError(f"byte 0: magic byte 0x{value[0]:02x}, the Confluent wire format has 0x00")
        return value[HEADER:], int.from_bytes(value[1:HEADER], "big", signed=True)

    def decode(self, values: pa.BinaryArray | pa.LargeBinaryArray) -> Decoded:
        """Every value decoded; a bad one is a null row with its error (never raises for a bad record)."""
        n = len(values)
        rows: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        ids: list[int | None] = [None] * n
        bad = np.zeros(n, dtype=bool)
        label = self.format_label
        for i, value in enumerate(values.to_pylist()):
            if value is None:
                bad[i] = True
                errors[i] = f"{label}: no value (null)"
                continue
            try:
                payload, schema_id = self._split(value)
                ids[i] = schema_id
                if schema_id is not None and self._known_ids is not None and not self._known_ids(schema_id):
                    raise WireError(f"bytes 1-4: schema id {schema_id} is not in the configured schema ids or registry")
                rows[i] = self._decode_one(payload, schema_id)
            except RunFailed:  # not the value's fault (a registry that cannot answer): the run stops
                raise
            except ValueSchemaError as err:  # a writer's schema (by id) that cannot be used: this row is bad
                bad[i] = True
                errors[i] = f"{label}: {err}"
            except Exception as err:  # noqa: BLE001 - any library error on bad bytes is this row's error
                bad[i] = True
                errors[i] = f"{label}: {_one_line(err)}"
        columns = self._to_arrow(rows, bad, errors)
        return Decoded(
            columns=columns,
            bad=bad,
            errors=pa.array(errors, type=pa.string()),
            schema_ids=pa.array(ids, type=pa.int32()),
        )

    def _to_arrow(self, rows: list[Any], bad: np.ndarray, errors: list[str | None]) -> pa.StructArray:
        try:
            return pa.array(rows, type=self.arrow_type)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        for i, row in enumerate(rows):  # find the rows Arrow cannot hold (an int out of range, ...)
            if row is None:
                continue
            try:
                pa.array([row], type=self.arrow_type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as err:
                rows[i] = None
                bad[i] = True
                errors[i] = f"{self.format_label}: not representable in its column: {_one_line(err)}"
        return pa.array(rows, type=self.arrow_type)


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return " ".join(text.split())
