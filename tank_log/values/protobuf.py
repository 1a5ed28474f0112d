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

Two paths give the same columns, bad rows and errors: protobuf's parser (upb), a message object per value, then
Arrow; and the compiled path (`_protobuf_fast.pyx`), which walks the wire format of the batch straight into column
slots. A decoder picks once (`fast`, logged at debug when it cannot): the compiled path when the compiled core runs and
the message and all it holds come from proto3 files, with no group, Struct, Value or ListValue and no field number
above 4096 (`_FastPlan`). Values with other message indexes than [0] or one below 64, and the few the compiled path
hands back (a oneof switching away from a message member, a Timestamp or Duration the columns cannot hold), take
protobuf's parser, value by value, in either case.
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib.util
import logging
import operator
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format  # type: ignore[import-untyped]
from google.protobuf.message_factory import GetMessageClass  # type: ignore[import-untyped]

from tank_log.errors import ValueSchemaError
from tank_log.format import native
from tank_log.values.fastpath import merge, spans
from tank_log.values.spec import (
    HEADER,
    NUMBER_KEY,
    BatchDecoder,
    Decoded,
    ValueSpec,
    WireError,
    require_file,
    zigzag_varint,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer  # bytes, or a buffer that frees its block (cython.view.array)

try:
    from tank_log.values import _protobuf_fast
except ImportError:  # not built (no C compiler): protobuf's parser decodes everything
    _protobuf_fast = None  # type: ignore[assignment]

_log = logging.getLogger(__name__)

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
        self._plan = _FastPlan.of(desc, self.arrow_type) if _protobuf_fast is not None and native.compiled() else None
        self.fast = self._plan is not None  # the compiled path decodes (values it cannot take aside)
        if _protobuf_fast is not None and native.compiled() and self._plan is None:
            _log.debug("protobuf: %s: the compiled path cannot decode it; protobuf's parser does", self._message)
        super().__init__(spec, fetch)

    def _indexes_mismatch(self, schema_id: int, indexes: list[int], start: int) -> str | None:
        """Why the message indexes of a value of `schema_id` do not name the reader's message (None: they do)."""
        own = schema_id in self._mains or self._fetch is not None  # the id's own schema (a file, the registry's)
        key = (schema_id if own else None, tuple(indexes))
        if key not in self._indexed:
            self._indexed[key] = self._mismatch(key[0], indexes, start)
        return self._indexed[key]

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        start = 0
        if schema_id is not None:
            indexes, start = message_indexes(payload)
            mismatch = self._indexes_mismatch(schema_id, indexes, start)
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

    def decode(self, values: pa.BinaryArray | pa.LargeBinaryArray) -> Decoded:
        """Every value decoded; a bad one is a null row with its error (never raises for a bad record)."""
        if self._plan is None or len(values) == 0:
            return super().decode(values)
        return self._decode_fast(values, self._plan)

    def _decode_fast(self, values: pa.BinaryArray | pa.LargeBinaryArray, plan: _FastPlan) -> Decoded:
        """The compiled path over the values it can take (present; with a header, a known id and message indexes
        [0] or [k] that name the reader's message); the others (few: null, a bad header or indexes, an unknown id,
        and those the compiled path hands back) go value by value through protobuf's parser, and take their places
        again."""
        found = spans(values, self._framed)
        data, starts, ends, ids, has_id = found.data, found.starts.copy(), found.ends, found.ids, found.has_id
        eligible = found.present
        where = np.zeros(len(values), np.int64)  # the message's first byte in the value, for its error
        if self._framed:
            # the message indexes: [0] (one 0 byte) or one index below 64 (2 bytes); any other form, value by value
            last = max(len(data) - 1, 0)
            first = data[np.minimum(starts, last)] if len(data) else np.zeros(len(values), np.uint8)
            second = data[np.minimum(starts + 1, last)] if len(data) else np.zeros(len(values), np.uint8)
            room = ends - starts
            one = has_id & (room >= 1) & (first == 0)
            two = has_id & (room >= 2) & (first == 2) & (second < 0x80)
            eligible = one | two
            skip = one.astype(np.int64) + 2 * two
            pair = (ids.astype(np.int64) << 8) | np.where(two, second.astype(np.int64) + 1, 0)  # (id, index + 1)
            chosen = pair[eligible]
            kinds = chosen[:1] if len(chosen) and (chosen == chosen[0]).all() else np.unique(chosen)
            for combined in kinds.tolist():
                schema_id, index = combined >> 8, (combined & 0xFF) - 1
                if not self._fast_id(schema_id, [0] if index < 0 else [(index >> 1) ^ -(index & 1)], 1 + (index >= 0)):
                    eligible &= pair != combined
            starts += skip
            where = np.where(eligible, HEADER + skip, 0)
        columns, codes, handed_back = plan.decode(data, starts, ends, eligible)
        if columns is None:  # a column of the batch would pass 2 GiB: value by value
            return super().decode(values)
        bad = (codes == E_MALFORMED) | (codes == E_UTF8)
        errors: dict[int, str] = {}
        for i in np.flatnonzero(bad).tolist():
            at_text = f"the message at byte {where[i]}" if self._framed else "the message"
            reason = "String field had bad UTF-8" if codes[i] == E_UTF8 else "Wire format was corrupt"
            errors[i] = f"{self.format_label}: {at_text}: Error parsing message with type '{self._message}': {reason}"
        slow = ~eligible | (codes == E_DEFER)
        slow[handed_back] = True
        return merge(values, columns, bad, errors, np.flatnonzero(slow), found, super().decode)

    def _fast_id(self, schema_id: int, indexes: list[int], start: int) -> bool:
        """Whether values of this schema id and message indexes can take the compiled path: a known id whose
        indexes name the reader's message (else protobuf's path names their error)."""
        try:
            if self._known_ids is not None and not self._known_ids(schema_id):
                return False
            return self._indexes_mismatch(schema_id, indexes, start) is None
        except (WireError, ValueSchemaError):
            return False


# the node kinds, varint forms and row codes of _protobuf_fast.pyx
K_MSG, K_VARINT, K_FIX32, K_FIX64, K_STRING, K_BYTES, K_LIST, K_MAP = range(8)
M_RAW, M_INT32, M_UINT32, M_SINT32, M_SINT64, M_BOOL = range(6)
E_MALFORMED, E_UTF8, E_DEFER = 1, 2, 3
_FAST_SCALARS = {  # FieldDescriptor.TYPE_* → (node kind, varint form)
    1: (K_FIX64, M_RAW),  # double
    2: (K_FIX32, M_RAW),  # float
    3: (K_VARINT, M_RAW),  # int64
    4: (K_VARINT, M_RAW),  # uint64
    5: (K_VARINT, M_INT32),  # int32
    6: (K_FIX64, M_RAW),  # fixed64
    7: (K_FIX32, M_RAW),  # fixed32
    8: (K_VARINT, M_BOOL),  # bool
    9: (K_STRING, M_RAW),  # string
    12: (K_BYTES, M_RAW),  # bytes
    13: (K_VARINT, M_UINT32),  # uint32
    14: (K_VARINT, M_INT32),  # enum
    15: (K_FIX32, M_RAW),  # sfixed32
    16: (K_FIX64, M_RAW),  # sfixed64
    17: (K_VARINT, M_SINT32),  # sint32
    18: (K_VARINT, M_SINT64),  # sint64
}
_MAX_NUMBER = 4096  # a message's field table is dense up to its highest field number: beyond, protobuf's parser
_MIN_US, _MAX_US = -62135596800_000_000, 253402300799_999_999  # Python's datetime range (protobuf.py converts)


class _Unsupported(Exception):
    """A message the compiled path does not decode."""


class _FastPlan:
    """A reader's message as the compiled path's program: one node per field (and per message), the root message
    node 0; a message type used twice is two subtrees (two columns). Nodes are grouped by slot space: the rows
    (group 0), and the elements of each repeated field and the entries of each map."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.arg: list[int] = []  # a varint's form
        self.group: list[int] = []
        self.defvalid: list[int] = []  # a slot's validity before its field is read
        self.elem: list[int] = []  # a repeated field's element node, a map's entry node
        self.table: dict[int, list[int]] = {}  # a message's child node by field number
        self.oneof_next: list[int] = []  # the next member of the node's oneof (a ring), -1
        self.entry: list[int] = []  # a map entry message: 1
        self.members: list[list[int]] = [[]]  # per group, its nodes
        self.owner: list[int] = [-1]  # per group, its repeated field or map node (-1: the rows)
        self.fields: dict[int, list[int]] = {}  # a message's child nodes in field order
        self.ptype: dict[int, int] = {}  # a scalar's FieldDescriptor.TYPE_*
        self.enums: dict[int, dict[int, str]] = {}
        self.wkt: dict[int, str] = {}  # a well-known type's message node: its full name
        self.arrow: pa.StructType = pa.struct([])
        self.program: list[np.ndarray] = []
        self._proto3: dict[str, bool] = {}

    @classmethod
    def of(cls, desc: Any, arrow: pa.StructType) -> _FastPlan | None:
        """The plan of a reader's message; None when the compiled path cannot decode it (proto2 and editions
        files, groups, Struct/Value/ListValue, field numbers above 4096)."""
        plan = cls()
        try:
            plan._message(desc, 0, 1)
        except _Unsupported:
            return None
        plan.arrow = arrow
        firsts: list[int] = []
        lens: list[int] = []
        ftab: list[int] = []
        for node in range(len(plan.kind)):
            row = plan.table.get(node, [])
            firsts.append(len(ftab))
            lens.append(len(row))
            ftab.extend(row)
        gfirst: list[int] = []
        gcount: list[int] = []
        gmembers: list[int] = []
        for nodes in plan.members:
            gfirst.append(len(gmembers))
            gcount.append(len(nodes))
            gmembers.extend(nodes)
        arrays = (plan.kind, plan.arg, plan.group, plan.defvalid, plan.elem, firsts, lens, ftab, plan.oneof_next)
        plan.program = [np.array(a, dtype=np.int64) for a in (*arrays, plan.entry, gfirst, gcount, gmembers)]
        return plan

    def _new(self, kind: int, group: int, defvalid: int, arg: int = 0) -> int:
        self.kind.append(kind)
        self.arg.append(arg)
        self.group.append(group)
        self.defvalid.append(defvalid)
        self.elem.append(-1)
        self.oneof_next.append(-1)
        self.entry.append(0)
        self.members[group].append(len(self.kind) - 1)
        return len(self.kind) - 1

    def _new_group(self, owner: int) -> int:
        self.members.append([])
        self.owner.append(owner)
        return len(self.members) - 1

    def _check_file(self, desc: Any) -> None:
        """Only proto3 files: proto2's closed enums, defaults, required fields and unchecked strings, and editions'
        features, are protobuf's parser's."""
        name = desc.file.name
        if name not in self._proto3:
            proto = descriptor_pb2.FileDescriptorProto()
            desc.file.CopyToProto(proto)
            self._proto3[name] = proto.syntax == "proto3"
        if not self._proto3[name]:
            raise _Unsupported(name)

    def _message(self, desc: Any, group: int, defvalid: int, entry: bool = False) -> int:
        self._check_file(desc)
        if desc.full_name in _JSON_TYPES:
            raise _Unsupported(desc.full_name)
        node = self._new(K_MSG, group, defvalid)
        self.entry[node] = int(entry)
        if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration") or desc.full_name in _WRAPPERS:
            self.wkt[node] = desc.full_name
        children = []
        for f in desc.fields:
            if f.number > _MAX_NUMBER:
                raise _Unsupported(f.full_name)
            # a map's value message is there even when the entry leaves it out (a struct of defaults)
            children.append(self._field(f, group, materialize=entry and f.name == "value"))
        self.fields[node] = children
        table = [-1] * (max((f.number for f in desc.fields), default=0) + 1)
        for f, child in zip(desc.fields, children, strict=True):
            table[f.number] = child
        self.table[node] = table
        for oneof in desc.oneofs:
            ring = [children[f.index] for f in oneof.fields]
            for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
                self.oneof_next[a] = b
        return node

    def _field(self, f: Any, group: int, materialize: bool = False) -> int:
        if f.type == TYPE_GROUP:
            raise _Unsupported(f.full_name)
        if _repeated(f):
            is_map = f.type == TYPE_MESSAGE and f.message_type.GetOptions().map_entry
            node = self._new(K_MAP if is_map else K_LIST, group, 1)
            inner = self._new_group(node)
            if is_map:
                self.elem[node] = self._message(f.message_type, inner, 1, entry=True)
            else:
                self.elem[node] = self._single(f, inner, 1)
            return node
        presence = _has_presence(f) and not _required(f) and not materialize
        return self._single(f, group, 0 if presence else 1)

    def _single(self, f: Any, group: int, defvalid: int) -> int:
        if f.type == TYPE_MESSAGE:
            return self._message(f.message_type, group, defvalid)
        kind, form = _FAST_SCALARS[f.type]
        node = self._new(kind, group, defvalid, form)
        self.ptype[node] = f.type
        if f.type == TYPE_ENUM:
            self.enums[node] = {v.number: v.name for v in f.enum_type.values}
        return node

    def decode(
        self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray, eligible: np.ndarray
    ) -> tuple[pa.StructArray | None, np.ndarray, np.ndarray]:
        """(the columns of every row, null where not eligible or bad; each row's code (0, E_MALFORMED, E_UTF8,
        E_DEFER); the rows to hand to protobuf's parser for a value the columns cannot hold as it converts it (a
        Timestamp or Duration out of range)). The columns are None when a string or bytes column of the batch
        would pass 2 GiB."""
        n = len(starts)
        codes = np.zeros(n, dtype=np.int8)
        kind, arg, group, defvalid, elem, tfirst, tlen, ftab, oneof_next, entry, gfirst, gcount, gmembers = self.program
        found = _protobuf_fast.decode(
            data, starts, ends, eligible.view(np.uint8), kind, arg, group, defvalid, elem, tfirst, tlen, ftab,
            oneof_next, entry, gfirst, gcount, gmembers, codes,
        )  # fmt: skip
        if found is None:
            return None, codes, np.zeros(0, np.int64)
        build = _Build(self, found[0], found[1])
        columns = build.array(0, self.arrow)
        return columns, codes, np.unique(np.concatenate([np.zeros(0, np.int64), *build.handed_back]))


class _Build:
    """The Arrow arrays of one decoded batch (the slots `_protobuf_fast.decode` gives) by the plan."""

    def __init__(self, plan: _FastPlan, sizes: list[int], slots: list[tuple[Buffer, Buffer, Buffer]]) -> None:
        self.plan = plan
        self.sizes = sizes
        self.slots = slots
        self.rows: dict[int, np.ndarray] = {}  # per group: each slot's row
        self.handed_back: list[np.ndarray] = []

    def _valid(self, node: int) -> np.ndarray:
        return np.frombuffer(memoryview(self.slots[node][0]), dtype=np.uint8).view(bool)

    def _ints(self, node: int, part: int) -> np.ndarray:
        return np.frombuffer(memoryview(self.slots[node][part]), dtype=np.int64)

    def _row_of(self, group: int) -> np.ndarray:
        """The row of each slot of `group`."""
        if group not in self.rows:
            owner = self.plan.owner[group]
            if owner < 0:
                self.rows[group] = np.arange(self.sizes[0], dtype=np.int64)
            else:
                parent = self._row_of(self.plan.group[owner])
                self.rows[group] = np.repeat(parent, self._ints(owner, 2) - self._ints(owner, 1))
        return self.rows[group]

    def array(self, node: int, t: pa.DataType) -> pa.Array:
        plan = self.plan
        kind, n = plan.kind[node], self.sizes[plan.group[node]]
        valid = self._valid(node)
        mask = pa.py_buffer(np.packbits(valid, bitorder="little"))
        if kind == K_MSG:
            wkt = plan.wkt.get(node)
            children = plan.fields[node]
            if wkt is None:
                arrays = [self.array(c, t.field(i).type) for i, c in enumerate(children)]
                return pa.StructArray.from_buffers(t, n, [mask], children=arrays)
            if wkt in _WRAPPERS:
                inner = self.array(children[0], t)
                return pa.Array.from_buffers(t, n, [mask, *inner.buffers()[1:]])
            return self._time(node, wkt, t, n, valid, mask)
        if kind in (K_STRING, K_BYTES):
            _, spans, chars = self.slots[node]
            return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(spans), pa.py_buffer(chars)])
        if kind in (K_LIST, K_MAP):
            starts, ends = self._ints(node, 1), self._ints(node, 2)
            offsets = np.empty(n + 1, np.int32)
            offsets[0] = starts[0] if n else 0
            offsets[1:] = ends
            if kind == K_LIST:
                element = self.array(plan.elem[node], t.value_type)
                return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(offsets)], children=[element])
            return self._map(node, t, n, offsets, mask)
        return self._scalar(node, t, n, valid, mask)

    def _scalar(self, node: int, t: pa.DataType, n: int, valid: np.ndarray, mask: pa.Buffer) -> pa.Array:
        ptype = self.plan.ptype[node]
        raw = np.frombuffer(memoryview(self.slots[node][1]), dtype=np.uint64)
        if ptype == TYPE_ENUM:
            names = self.plan.enums[node]
            numbers, index = np.unique(raw.astype(np.int32), return_inverse=True)
            symbols = pa.array([names.get(k, str(k)) for k in numbers.tolist()], pa.string())
            indices = pa.array(index.astype(np.int32), mask=~valid)
            return pa.DictionaryArray.from_arrays(indices, symbols).dictionary_decode()
        if ptype in _UNSIGNED_64:
            wide = np.zeros((n, 2), np.uint64)
            wide[:, 0] = raw
            return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(wide)])
        if ptype == 8:  # bool
            return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(np.packbits(raw != 0, bitorder="little"))])
        if ptype == 2:  # float: its 4 bytes
            values: np.ndarray = raw.astype(np.uint32).view(np.float32)
        elif ptype == 1:  # double
            values = raw.view(np.float64)
        elif pa.types.is_int32(t):
            values = raw.astype(np.int32)
        else:  # int64, sint64, sfixed64; uint32 and fixed32 (zero-extended)
            values = raw.view(np.int64)
        return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(values)])

    def _time(self, node: int, wkt: str, t: pa.DataType, n: int, valid: np.ndarray, mask: pa.Buffer) -> pa.Array:
        """A Timestamp (µs since the epoch, floored as protobuf.py's `_timestamp`) or a Duration (µs, truncated as
        `_duration`); one protobuf.py cannot convert (out of Python's or Arrow's range) is handed back."""
        seconds_node, nanos_node = self.plan.fields[node]
        seconds = np.frombuffer(memoryview(self.slots[seconds_node][1]), dtype=np.int64)
        nanos = np.frombuffer(memoryview(self.slots[nanos_node][1]), dtype=np.int64)  # sign-extended int32
        limit = 10**12 if wkt == "google.protobuf.Timestamp" else 9 * 10**12
        inside = (seconds >= -limit) & (seconds <= limit)  # (not np.abs: it keeps -2**63 negative)
        safe = np.where(inside, seconds, 0)
        if wkt == "google.protobuf.Timestamp":
            us = safe * 1_000_000 + nanos // 1000
            inside &= (us >= _MIN_US) & (us <= _MAX_US)
        else:
            us = safe * 1_000_000 + np.trunc(nanos / 1000).astype(np.int64)
        out = valid & ~inside
        if out.any():
            self.handed_back.append(np.unique(self._row_of(self.plan.group[node])[out]))
        return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(np.where(inside, us, 0))])

    def _map(self, node: int, t: pa.MapType, n: int, offsets: np.ndarray, mask: pa.Buffer) -> pa.Array:
        """A map as protobuf.py gives it: its entries sorted by key, the last of a key kept (upb's), an entry with
        an unknown field left out (upb keeps it apart)."""
        entry = self.plan.elem[node]
        key_node, value_node = self.plan.fields[entry]
        keys = self.array(key_node, t.key_type)
        items = self.array(value_node, t.item_type)
        kept = self._valid(entry)
        parent = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
        table = pa.table({"p": parent, "k": keys, "i": np.arange(len(keys), dtype=np.int64)}).filter(kept)
        table = table.take(
            pc.sort_indices(table, sort_keys=[("p", "ascending"), ("k", "ascending"), ("i", "ascending")])
        )
        p, k = table.column("p").to_numpy(), table.column("k").combine_chunks()
        last = np.ones(len(p), bool)
        if len(p) > 1:
            same = pc.equal(k.slice(0, len(p) - 1), k.slice(1)).to_numpy(zero_copy_only=False)
            last[:-1] = ~((p[:-1] == p[1:]) & same)
        chosen = pa.array(table.column("i").to_numpy()[last])
        counts = np.bincount(p[last], minlength=n)
        new_offsets = np.zeros(n + 1, np.int32)
        np.cumsum(counts, out=new_offsets[1:])
        entries = pa.StructArray.from_arrays(
            [keys.take(chosen), items.take(chosen)], fields=[t.key_field, t.item_field]
        )
        return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(new_offsets)], children=[entries])
