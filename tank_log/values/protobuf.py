"""Protobuf values (google.protobuf, upb): the message class comes from a FileDescriptorSet (`.desc`, `protoc
--include_imports --descriptor_set_out`) or a `.proto` compiled at load by grpcio-tools' bundled protoc.

Types: double/float → float64/float32, int32/sint32/sfixed32 → int32, int64/sint64/sfixed64 and uint32/fixed32 →
int64, uint64/fixed64 → decimal128(20, 0) (no table format has unsigned 64-bit ints), bool, string, bytes → binary,
enum → string (its name; an unknown number as its digits), message → struct (nullable), repeated → list, map → map,
oneof → its fields (nullable), proto3 `optional` → nullable, google.protobuf.Timestamp → timestamp[us, UTC],
Duration → duration[us], the wrappers (Int64Value, ...) → nullable scalars, Struct/Value/ListValue → JSON text.
Each field's number is kept in its Arrow metadata (`protobuf.number`): a renamed field stays the same column.
The Confluent Protobuf framing (after the schema id, the message indexes) is read and the reader's message decodes
the bytes (Protobuf resolves versions by field number).
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib.util
import operator
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format  # type: ignore[import-untyped]
from google.protobuf.message_factory import GetMessageClass  # type: ignore[import-untyped]

from tank_log.errors import ValueSchemaError
from tank_log.values.spec import NUMBER_KEY, BatchDecoder, ValueSpec, WireError, require_file, zigzag_varint

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_JSON_TYPES = ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue")

# FieldDescriptor.TYPE_* → Arrow
_SCALARS: dict[int, pa.DataType] = {
    1: pa.float64(),  # double
    2: pa.float32(),  # float
    3: pa.int64(),  # int64
    4: pa.decimal128(20, 0),  # uint64
    5: pa.int32(),  # int32
    6: pa.decimal128(20, 0),  # fixed64
    7: pa.int64(),  # fixed32
    8: pa.bool_(),  # bool
    9: pa.string(),  # string
    12: pa.binary(),  # bytes
    13: pa.int64(),  # uint32
    15: pa.int32(),  # sfixed32
    16: pa.int64(),  # sfixed64
    17: pa.int32(),  # sint32
    18: pa.int64(),  # sint64
}
_UNSIGNED_64 = (4, 6)
TYPE_MESSAGE, TYPE_ENUM, TYPE_GROUP = 11, 14, 10

Convert = Callable[[Any], Any]


def load_pool(path: str) -> tuple[Any, list[str], Any]:
    """(descriptor pool, the messages of the main file by full name, the main FileDescriptorProto) of a `.desc`
    or `.proto` file (the main file: the one protoc was given, written last)."""
    require_file(path, "Protobuf schema file")
    if path.endswith(".proto"):
        data = _compile(path)
    else:
        with open(path, "rb") as fh:
            data = fh.read()
    fds = descriptor_pb2.FileDescriptorSet()
    try:
        fds.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError
        raise ValueSchemaError(f"{path}: not a FileDescriptorSet (protoc --descriptor_set_out): {err}") from None
    if not fds.file:
        raise ValueSchemaError(f"{path}: not a FileDescriptorSet (protoc --descriptor_set_out): no files")
    pool = descriptor_pool.DescriptorPool()
    present = {f.name for f in fds.file}
    added: set[str] = set()
    try:
        for f in fds.file:
            for dep in f.dependency:  # a well-known type's file the set left out: the one protobuf ships
                if dep not in present and dep not in added and dep.startswith("google/protobuf/"):
                    proto = descriptor_pb2.FileDescriptorProto()
                    descriptor_pool.Default().FindFileByName(dep).CopyToProto(proto)
                    pool.Add(proto)
                    added.add(dep)
            pool.Add(f)
    except Exception as err:  # noqa: BLE001 - a set without its imports, a conflict
        raise ValueSchemaError(
            f"{path}: cannot load its descriptors ({' '.join(str(err).split())}); build it with --include_imports"
        ) from None
    main = fds.file[-1]  # protoc writes the files it was given last (after their imports)
    prefix = f"{main.package}." if main.package else ""
    return pool, [prefix + m.name for m in main.message_type], main


def _compile(path: str) -> bytes:
    """The FileDescriptorSet of a `.proto` file, by grpcio-tools' bundled protoc (in a temporary directory)."""
    found = importlib.util.find_spec("grpc_tools")
    if found is None or found.origin is None:
        raise ValueSchemaError(f"{path}: compiling a .proto needs grpcio-tools (or give a .desc descriptor set)")
    include = os.path.join(os.path.dirname(found.origin), "_proto")  # the well-known types' .proto files
    here = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryDirectory(prefix=".tank-log-protoc-") as tmp:
        out = os.path.join(tmp, "set.desc")
        args = ["-I", here, "-I", include, "--include_imports", f"--descriptor_set_out={out}", os.path.abspath(path)]
        proc = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", *args], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or not os.path.exists(out):
            first = (proc.stderr.strip().splitlines() or [f"protoc exited {proc.returncode}"])[0]
            raise ValueSchemaError(f"{path}: protoc cannot compile it: {first}")
        with open(out, "rb") as fh:
            return fh.read()


def _main_of_text(text: str) -> Any:
    """The main file of a registry's `.proto` text, compiled; None when protoc cannot compile it alone (it imports
    other registered schemas)."""
    with tempfile.TemporaryDirectory(prefix=".tank-log-registry-") as tmp:
        path = os.path.join(tmp, "registered.proto")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            data = _compile(path)
        except ValueSchemaError:
            return None
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(data)
    return fds.file[-1] if fds.file else None


def message_descriptor(pool: Any, name: str, where: str, choices: list[str]) -> Any:
    """The descriptor of message `name`; ValueSchemaError naming the file and the messages it has."""
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        listed = ", ".join(choices) or "none"
        raise ValueSchemaError(f"{where}: no message {name!r} (its file's messages: {listed})") from None


def arrow_type(desc: Any, where: str) -> pa.StructType:
    """The Arrow struct of a message's fields (see the module's mapping)."""
    t, _ = _message(desc, where, set())
    return t


def _message(desc: Any, where: str, active: set[str]) -> tuple[pa.StructType, Convert]:
    """(Arrow struct, converter of a message to its row: a tuple in field order, which Arrow takes for a struct)."""
    if desc.full_name in active:
        raise ValueSchemaError(f"{where}: message {desc.full_name} is recursive: a table column cannot hold it")
    active = active | {desc.full_name}
    fields, fixes = [], []
    for i, f in enumerate(desc.fields):
        t, nullable, conv = _field(f, where, active)
        fields.append(pa.field(f.name, t, nullable=nullable, metadata={NUMBER_KEY: str(f.number).encode()}))
        presence = nullable and not _repeated(f)
        if presence or conv is not None:
            fixes.append((i, f.name, presence, conv))
    if not fields:
        return pa.struct(fields), lambda m: ()
    names = [f.name for f in desc.fields]
    # every field at once (in C); the few that need more are fixed after
    get: Callable[[Any], Any] = operator.attrgetter(*names)
    if len(names) == 1:
        single = get

        def get(m: Any) -> tuple[Any, ...]:
            return (single(m),)

    if not fixes:
        return pa.struct(fields), get

    def convert(m: Any) -> tuple[Any, ...]:
        row = list(get(m))
        for i, name, presence, conv in fixes:
            if presence and not m.HasField(name):
                row[i] = None
            elif conv is not None:
                row[i] = conv(row[i])
        return tuple(row)

    return pa.struct(fields), convert


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated) if hasattr(f, "is_repeated") else bool(f.label == 3)


def _required(f: Any) -> bool:
    return bool(f.is_required) if hasattr(f, "is_required") else bool(f.label == 2)


def _has_presence(f: Any) -> bool:
    presence = getattr(f, "has_presence", None)
    if presence is not None:
        return bool(presence)
    return f.type == TYPE_MESSAGE or f.containing_oneof is not None


def _field(f: Any, where: str, active: set[str]) -> tuple[pa.DataType, bool, Convert | None]:
    """(Arrow type, nullable, converter of the Python value or None) of a field."""
    if _repeated(f):
        if f.type == TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            key = f.message_type.fields_by_name["key"]
            value = f.message_type.fields_by_name["value"]
            kt, _, kconv = _single(key, where, active)
            vt, _, vconv = _single(value, where, active)

            def pairs(m: Any) -> list[tuple[Any, Any]]:
                return [
                    (k if kconv is None else kconv(k), v if vconv is None else vconv(v)) for k, v in sorted(m.items())
                ]

            return pa.map_(kt, pa.field("value", vt, nullable=False)), False, pairs
        et, _, econv = _single(f, where, active)
        if econv is None:
            return pa.list_(pa.field("element", et, nullable=False)), False, list
        return pa.list_(pa.field("element", et, nullable=False)), False, lambda v: [econv(x) for x in v]
    t, _, conv = _single(f, where, active)
    nullable = _has_presence(f) and not _required(f)
    return t, nullable, conv


def _single(f: Any, where: str, active: set[str]) -> tuple[pa.DataType, bool, Convert | None]:
    """The type of one value of a field (an element of a repeated one)."""
    if f.type == TYPE_ENUM:
        by_number = {v.number: v.name for v in f.enum_type.values}
        return pa.string(), False, lambda n: by_number.get(n, str(n))
    if f.type in (TYPE_MESSAGE, TYPE_GROUP):
        name = f.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return pa.timestamp("us", tz="UTC"), True, _timestamp
        if name == "google.protobuf.Duration":
            return pa.duration("us"), True, _duration
        if name in _WRAPPERS:
            t = _WRAPPERS[name]
            return t, True, (lambda w: decimal.Decimal(w.value)) if pa.types.is_decimal(t) else (lambda w: w.value)
        if name in _JSON_TYPES:
            return pa.string(), True, lambda m: json_format.MessageToJson(m, indent=None, sort_keys=True)
        t, conv = _message(f.message_type, where, active)
        return t, True, conv
    if f.type in _UNSIGNED_64:
        return _SCALARS[f.type], False, decimal.Decimal
    if f.type not in _SCALARS:
        raise ValueSchemaError(f"{where}: field {f.full_name}: unknown Protobuf type {f.type}")
    return _SCALARS[f.type], False, None


def _timestamp(ts: Any) -> dt.datetime:
    return _EPOCH + dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _duration(d: Any) -> dt.timedelta:
    return dt.timedelta(seconds=d.seconds, microseconds=int(d.nanos / 1000))


def message_indexes(payload: bytes) -> tuple[list[int], int]:
    """The Confluent Protobuf message indexes at the start of `payload`: (indexes, the message's first byte).
    A single 0 byte means [0] (the file's first message)."""
    count, pos = zigzag_varint(payload, 0)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise WireError(f"byte 5: {count} message indexes: not the Confluent Protobuf framing")
    out = []
    for _ in range(count):
        index, pos = zigzag_varint(payload, pos)
        out.append(index)
    return out, pos


class ProtobufDecoder(BatchDecoder):
    """Protobuf values decoded with the reader's message class (the spec's schema file and message name)."""

    format_label = "protobuf"

    def __init__(self, spec: ValueSpec, fetch: Callable[[int], str] | None = None) -> None:
        """`fetch(id)` asks a registry whether an id exists (ids not in `spec.schema_ids`): the reader's schema
        decodes every id (Protobuf by field number, JSON by name)."""
        self._ids = dict(spec.schema_ids)
        path = spec.schema_file or (self._ids[max(self._ids)] if self._ids else None)
        if path is None:
            raise ValueSchemaError("protobuf: a schema file (.desc or .proto) is needed for the columns")
        pool, messages, main = load_pool(path)
        # the main file of each id's schema: the Confluent message indexes name a message in it
        mains = {path: main} | {p: load_pool(p)[2] for p in set(self._ids.values()) - {path}}
        self._mains: dict[int | None, Any] = {i: mains[p] for i, p in self._ids.items()}
        if not self._ids and fetch is None:
            self._mains[None] = main  # no ids configured: every id's indexes are read against the schema file
        name = spec.message
        if name is None:
            if len(messages) != 1:
                listed = ", ".join(messages) or "none"
                raise ValueSchemaError(f"{path}: name the message (value_message); the file has: {listed}")
            name = messages[0]
        desc = message_descriptor(pool, name, path, messages)
        self._message = desc.full_name
        self._indexed: dict[tuple[int | None, tuple[int, ...]], str | None] = {}  # (id, indexes) → a mismatch
        self._cls = GetMessageClass(desc)
        self.arrow_type, self._convert = _message(desc, path, set())
        super().__init__(spec, fetch)

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        start = 0
        if schema_id is not None:
            indexes, start = message_indexes(payload)
            own = schema_id in self._mains or self._fetch is not None  # the id's own schema (a file, the registry's)
            key = (schema_id if own else None, tuple(indexes))
            if key not in self._indexed:
                self._indexed[key] = self._mismatch(key[0], indexes, start)
            mismatch = self._indexed[key]
            if mismatch is not None:
                raise WireError(mismatch)
        msg = self._cls()
        try:
            msg.ParseFromString(payload[start:] if start else payload)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError (truncated, a bad wire type, ...)
            where = f"the message at byte {start + 5}" if schema_id is not None else "the message"
            raise WireError(f"{where}: {' '.join(str(err).split()) or type(err).__name__}") from None
        return self._convert(msg)

    def _mismatch(self, schema_id: int | None, indexes: list[int], start: int) -> str | None:
        """Why the message indexes do not name the reader's message (in the id's schema), or None when they do
        (or the id's schema cannot be had: a registry's that imports others)."""
        if schema_id is not None and schema_id not in self._mains and self._fetch is not None:
            self._mains[schema_id] = _main_of_text(self._fetch(schema_id))
        main = self._mains.get(schema_id)
        if main is None:
            return None
        name, types = main.package, main.message_type
        for depth, index in enumerate(indexes):
            if not 0 <= index < len(types):
                return f"bytes 5-{start + 4}: message indexes {indexes}: no message at position {depth}"
            name = f"{name}.{types[index].name}" if name else types[index].name
            types = types[index].nested_type
        if name != self._message:
            return f"bytes 5-{start + 4}: message indexes {indexes} name {name}, not {self._message}"
        return None
