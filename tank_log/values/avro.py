"""Avro values (fastavro): a schema file (`.avsc`) is the reader's schema and the table's type; the Confluent wire
format's schema ids name the writers' schemas (Avro schema resolution when they differ from the reader's).

Types: record → struct, array → list, map → map<string, …>, enum → string, fixed/bytes → binary, decimal →
decimal128 (decimal256 beyond 38 digits), uuid → string, date → date32, time-millis → time32[ms], time-micros →
time64[us], timestamp-millis/micros → timestamp[us, UTC], local-timestamp-* → timestamp[us]; a union of null and
one type → that type, nullable; any other union → a struct of its branches (named by type, or by a named type's
name), exactly one of them set per value. A field's aliases are kept in its Arrow metadata (`avro.aliases`), so a
renamed field stays the same column (`tank_log.values.evolve`).

A record's fields are the columns. A schema whose top level is not a record (`"string"`, an array, a map, an enum, a
union) is one column, `value`, of that type (nullable when the type is: a union with null): it decodes as a record of
that one field (`as_record`: the same bytes), the writers' schemas likewise.

Two paths give the same columns and the same bad rows: fastavro's reader, value by value into Python objects, and
the compiled fast path (`_avro_fast.pyx`), the batch in bulk straight into column buffers. A decoder picks once
(`fast`): the fast path when the compiled core runs and the reader's schema is a record of null, boolean, int, long,
float, double, string, bytes, fixed, enum, records and [null, T] unions of them, and the logical types date,
timestamp-* and local-timestamp-* (`_FastPlan`); values whose writer's schema differs from the reader's take
fastavro's path, value by value, in either case.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from tank_log.errors import ValueSchemaError
from tank_log.format import native
from tank_log.values.fastpath import merge, spans
from tank_log.values.spec import (
    ALIASES_KEY,
    BatchDecoder,
    Decoded,
    ValueSpec,
    WireError,
    require_file,
)

try:
    from tank_log.values import _avro_fast
except ImportError:  # not built (no C compiler): fastavro's path decodes everything
    _avro_fast = None  # type: ignore[assignment]

_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_NAMED = ("record", "error", "enum", "fixed")

Convert = Callable[[Any], Any]


def load_schema_text(path: str) -> Any:
    """The JSON of an `.avsc` file; ValueSchemaError naming the file when it is missing or not JSON."""
    require_file(path, "Avro schema file")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueSchemaError(f"{path}: not an Avro schema (JSON): {err}") from None


def parse(schema: Any, where: str) -> Any:
    """fastavro's parsed schema (uuid read as its string); ValueSchemaError naming `where` when it is not Avro."""
    try:
        return fastavro.parse_schema(_without_uuid(schema))
    except Exception as err:  # noqa: BLE001 - fastavro raises several types for a bad schema
        raise ValueSchemaError(f"{where}: not a valid Avro schema: {' '.join(str(err).split())}") from None


def _without_uuid(schema: Any) -> Any:
    """The schema with the uuid logical type dropped (fastavro would give uuid.UUID objects; the column is a
    string, the value as written)."""
    if isinstance(schema, list):
        return [_without_uuid(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _without_uuid(v) for k, v in schema.items()}
    if out.get("logicalType") == "uuid":
        del out["logicalType"]
    return out


class _Names:
    """Named types by full name, as the walk defines them (Avro's namespace rules)."""

    def __init__(self) -> None:
        self.types: dict[str, Any] = {}
        self.active: set[str] = set()
        self.several = False  # a union of several non-null types seen: fastavro must name the branches it reads
        self.named = False  # converters unwrap fastavro's (name, value) pairs (return_named_type)

    @staticmethod
    def full(name: str, namespace: str | None) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def lookup(self, name: str, namespace: str | None) -> tuple[str, Any] | None:
        for candidate in (self.full(name, namespace), name):
            if candidate in self.types:
                return candidate, self.types[candidate]
        return None


TOP_LEVEL = "tank_log_top_level"  # the record `as_record` wraps a schema in (a name no schema of a value uses)


def as_record(schema: Any) -> Any:
    """The schema when its top level is a record; else a record of one field, `value`, of the schema's type (Avro
    encodes a record as its fields, one after the other: the same bytes decode as that record)."""
    node = schema
    while isinstance(node, dict) and isinstance(node.get("type"), dict):  # {"type": {"type": "record", ...}}
        node = node["type"]
    if isinstance(node, dict) and node.get("type") in ("record", "error"):
        return schema
    return {"type": "record", "name": TOP_LEVEL, "fields": [{"name": "value", "type": schema}]}


def arrow_type(schema: Any, where: str = "schema") -> pa.StructType:
    """The Arrow struct type of a record schema (the columns); ValueSchemaError when the top level is not a record
    (`as_record` makes one) or a type cannot be a column (a recursive record)."""
    names = _Names()
    t, _, _ = _walk(schema, names, None, where)
    if not pa.types.is_struct(t):
        raise ValueSchemaError(f"{where}: the top-level Avro type must be a record (the columns), not {t}")
    return t


def converter(schema: Any) -> Convert | None:
    """The Python-side conversion fastavro's output needs before Arrow (only unions of several types); None when
    the output converts as is."""
    names = _Names()
    _, _, conv = _walk(schema, names, None, "schema")
    if names.several:  # again, unwrapping the (name, value) pairs fastavro then gives for every named union branch
        names = _Names()
        names.named = True
        _, _, conv = _walk(schema, names, None, "schema")
    return conv


def _walk(schema: Any, names: _Names, namespace: str | None, where: str) -> tuple[pa.DataType, bool, Convert | None]:
    """(Arrow type, nullable, converter or None) of an Avro schema node."""
    if isinstance(schema, str):
        if schema == "null":
            return pa.null(), True, None
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema], False, None
        found = names.lookup(schema, namespace)
        if found is None:
            raise ValueSchemaError(f"{where}: unknown Avro type {schema!r}")
        fullname, node = found
        if fullname in names.active:
            raise ValueSchemaError(f"{where}: record {fullname} is recursive: a table column cannot hold it")
        return _walk(node, names, fullname.rpartition(".")[0] or None, where)
    if isinstance(schema, list):
        return _union(schema, names, namespace, where)
    if not isinstance(schema, dict) or "type" not in schema:
        raise ValueSchemaError(f"{where}: not an Avro schema node: {json.dumps(schema)[:80]}")
    kind = schema["type"]
    logical = schema.get("logicalType")
    if kind in _NAMED:
        fullname = names.full(str(schema.get("name", "")), schema.get("namespace", namespace))
        names.types[fullname] = schema
        namespace = fullname.rpartition(".")[0] or None
    if logical is not None:
        t = _logical(schema, kind, logical)
        if t is not None:
            return t, False, None
    if kind in ("record", "error"):
        fullname = names.full(str(schema["name"]), namespace)
        names.active.add(fullname)
        fields, convs = [], {}
        for f in schema.get("fields", []):
            ft, nullable, conv = _walk(f["type"], names, namespace, f"{where}: {fullname}.{f['name']}")
            meta = {ALIASES_KEY: json.dumps(f["aliases"]).encode()} if f.get("aliases") else None
            fields.append(pa.field(f["name"], ft, nullable=nullable, metadata=meta))
            if conv is not None:
                convs[f["name"]] = conv
        names.active.discard(fullname)
        return pa.struct(fields), False, _record_converter(convs)
    if kind == "enum":
        return pa.string(), False, None
    if kind == "fixed":
        return pa.binary(), False, None
    if kind == "array":
        it, inull, iconv = _walk(schema["items"], names, namespace, f"{where}[]")
        return pa.list_(pa.field("element", it, nullable=inull)), False, _list_converter(iconv)
    if kind == "map":
        vt, vnull, vconv = _walk(schema["values"], names, namespace, f"{where}{{}}")
        return pa.map_(pa.string(), pa.field("value", vt, nullable=vnull)), False, _map_converter(vconv)
    if isinstance(kind, (str, list, dict)):  # {"type": "long"} and the like
        return _walk(kind, names, namespace, where)
    raise ValueSchemaError(f"{where}: unknown Avro type {kind!r}")


def _logical(schema: Mapping[str, Any], kind: Any, logical: str) -> pa.DataType | None:
    """The Arrow type of a logical type fastavro reads; None for one it ignores (the underlying type's column)."""
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema.get("precision", 0)), int(schema.get("scale", 0))
        if not 0 < precision <= 76 or not 0 <= scale <= precision:
            return None  # an invalid decimal is its underlying type (the Avro spec)
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    return {
        ("int", "date"): pa.date32(),
        ("int", "time-millis"): pa.time32("ms"),
        ("long", "time-micros"): pa.time64("us"),
        ("long", "timestamp-millis"): pa.timestamp("us", tz="UTC"),
        ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
        ("long", "local-timestamp-millis"): pa.timestamp("us"),
        ("long", "local-timestamp-micros"): pa.timestamp("us"),
    }.get((kind, logical))


def _branch_name(schema: Any) -> str:
    if isinstance(schema, str):
        return schema.rpartition(".")[2]
    if isinstance(schema, dict):
        if schema.get("type") in _NAMED:
            return str(schema["name"]).rpartition(".")[2]
        if isinstance(schema.get("type"), str) and schema["type"] not in _NAMED:
            return str(schema.get("logicalType") or schema["type"])
    return "branch"


def _union(
    branches: list[Any], names: _Names, namespace: str | None, where: str
) -> tuple[pa.DataType, bool, Convert | None]:
    nullable = any(b == "null" or (isinstance(b, dict) and b.get("type") == "null") for b in branches)
    rest = [b for b in branches if not (b == "null" or (isinstance(b, dict) and b.get("type") == "null"))]
    if not rest:
        return pa.null(), True, None
    if len(rest) == 1:
        t, _, conv = _walk(rest[0], names, namespace, where)
        return t, True, _unwrap_converter(conv) if names.named else _nullable_converter(conv)
    names.several = True
    fields, matchers, convs = [], [], []
    seen: set[str] = set()
    for b in rest:
        t, _, conv = _walk(b, names, namespace, where)
        name = _branch_name(b)
        while name in seen:
            name += "_"
        seen.add(name)
        fields.append(pa.field(name, t, nullable=True))
        matchers.append(_matcher(b, t, names, namespace))
        convs.append(conv)
    return pa.struct(fields), nullable, _union_converter([f.name for f in fields], matchers, convs)


def _matcher(schema: Any, t: pa.DataType, names: _Names, namespace: str | None) -> Callable[[Any, str | None], bool]:
    """Whether a decoded value (and the named type's name fastavro reports, if any) belongs to this branch."""
    named = None
    if isinstance(schema, dict) and schema.get("type") in _NAMED:
        named = names.full(str(schema["name"]), schema.get("namespace", namespace))
    elif isinstance(schema, str) and schema not in _PRIMITIVES and schema != "null":
        found = names.lookup(schema, namespace)
        named = found[0] if found else schema
    if named is not None:
        short = named.rpartition(".")[2]
        return lambda v, n: n is not None and n.rpartition(".")[2] == short
    if pa.types.is_boolean(t):
        return lambda v, n: n is None and isinstance(v, bool)
    if pa.types.is_int32(t):
        return lambda v, n: n is None and type(v) is int and -(2**31) <= v < 2**31
    if pa.types.is_integer(t):
        return lambda v, n: n is None and type(v) is int
    if pa.types.is_floating(t):
        return lambda v, n: n is None and isinstance(v, float)
    if pa.types.is_string(t):
        return lambda v, n: n is None and isinstance(v, str)
    if pa.types.is_binary(t):
        return lambda v, n: n is None and isinstance(v, bytes)
    if pa.types.is_list(t):
        return lambda v, n: n is None and isinstance(v, list)
    if pa.types.is_map(t):
        return lambda v, n: n is None and isinstance(v, dict)
    pytype = {pa.types.is_date32: "date", pa.types.is_timestamp: "datetime", pa.types.is_decimal: "Decimal"}
    for test, name in pytype.items():
        if test(t):
            return lambda v, n, name=name: n is None and type(v).__name__ == name  # type: ignore[misc]
    return lambda v, n: n is None and type(v).__name__ in ("time",)


def _named(value: Any) -> tuple[Any, str | None]:
    """fastavro's (name, value) pair for a named type in a union (return_named_type), or the value as is."""
    if type(value) is tuple and len(value) == 2 and isinstance(value[0], str):
        return value[1], value[0]
    return value, None


def _nullable_converter(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else conv(v)


def _unwrap_converter(conv: Convert | None) -> Convert:
    def unwrap(v: Any) -> Any:
        v, _ = _named(v)
        return v if v is None or conv is None else conv(v)

    return unwrap


def _union_converter(names: list[str], matchers: list[Callable[[Any, str | None], bool]], convs: list[Any]) -> Convert:
    def branch(v: Any) -> Any:
        if v is None:
            return None
        v, named = _named(v)
        for name, match, conv in zip(names, matchers, convs, strict=True):
            if match(v, named):
                return {name: v if conv is None else conv(v)}
        raise WireError(f"a union value of no branch: {type(v).__name__}")

    return branch


def _record_converter(convs: dict[str, Convert]) -> Convert | None:
    if not convs:
        return None
    items = list(convs.items())

    def record(v: Any) -> Any:
        if v is None:
            return None
        out = dict(v)
        for name, conv in items:
            out[name] = conv(out.get(name))
        return out

    return record


def _list_converter(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else [conv(x) for x in v]


def _map_converter(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else {k: conv(x) for k, x in v.items()}


class AvroDecoder(BatchDecoder):
    """Avro values decoded with fastavro; the reader's schema is the spec's schema file (else the highest id's)."""

    format_label = "avro"

    def __init__(self, spec: ValueSpec, fetch: Callable[[int], str] | None = None) -> None:
        """`fetch(id)` gives a schema's text from a registry (ids not in `spec.schema_ids`)."""
        self._writer_files = dict(spec.schema_ids)
        self._writers: dict[int, Any] = {}
        if spec.schema_file is not None:
            raw, where = load_schema_text(spec.schema_file), spec.schema_file
        elif self._writer_files:
            where = self._writer_files[max(self._writer_files)]
            raw = load_schema_text(where)
        else:
            raise ValueSchemaError("avro: a schema file (value_schema_file) or schema ids are needed for the columns")
        raw = as_record(raw)  # a top level that is not a record: one `value` column
        self._reader = parse(raw, where)
        self._reader_form = fastavro.schema.to_parsing_canonical_form(self._reader)
        self.arrow_type = arrow_type(raw, where)
        self._convert = converter(raw)
        self._plan = _FastPlan.of(raw, self.arrow_type) if _avro_fast is not None and native.compiled() else None
        self.fast = self._plan is not None  # the compiled path decodes (values a writer's schema resolves aside)
        self._named = self._convert is not None  # unions of several types: fastavro names the branch it read
        for schema_id, path in self._writer_files.items():  # a missing or bad file is a configuration error
            self._writers[schema_id] = self._resolving(parse(as_record(load_schema_text(path)), path))
        super().__init__(spec, fetch)

    def _writer(self, schema_id: int | None) -> Any:
        if schema_id is None or (not self._writer_files and self._fetch is None):
            return None
        if schema_id in self._writers:
            return self._writers[schema_id]
        if self._fetch is None:
            raise WireError(f"schema id {schema_id} is not configured")
        text = self._fetch(schema_id)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueSchemaError(f"schema id {schema_id}: not an Avro schema (JSON): {err}") from None
        found = self._writers[schema_id] = self._resolving(parse(as_record(raw), f"schema id {schema_id}"))
        return found

    def _resolving(self, writer: Any) -> Any:
        """The writer's schema when it differs from the reader's; None when both encode alike (the same Parsing
        Canonical Form): the reader's schema alone then reads the value, without fastavro resolving it per call
        (measured: 1.5 against 40 µs a message)."""
        return None if fastavro.schema.to_parsing_canonical_form(writer) == self._reader_form else writer

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        writer = self._writer(schema_id)
        bio = io.BytesIO(payload)
        try:
            if writer is None:
                row = fastavro.schemaless_reader(bio, self._reader, None, return_named_type=self._named)
            else:
                row = fastavro.schemaless_reader(bio, writer, self._reader, return_named_type=self._named)
        except EOFError:
            raise WireError(f"byte {bio.tell()}: truncated: the value ends inside a field") from None
        except StopIteration:
            raise WireError(f"byte {bio.tell()}: truncated") from None
        except Exception as err:  # noqa: BLE001 - a bad value: fastavro's error, with where it stopped
            raise WireError(f"byte {bio.tell()}: {' '.join(str(err).split()) or type(err).__name__}") from None
        if bio.tell() != len(payload):
            raise WireError(f"byte {bio.tell()}: {len(payload) - bio.tell()} bytes left after the record")
        return row if self._convert is None else self._convert(row)

    def decode(self, values: pa.BinaryArray | pa.LargeBinaryArray) -> Decoded:
        """Every value decoded; a bad one is a null row with its error (never raises for a bad record)."""
        if self._plan is None or len(values) == 0:
            return super().decode(values)
        return self._decode_fast(values, self._plan)

    def _decode_fast(self, values: pa.BinaryArray | pa.LargeBinaryArray, plan: _FastPlan) -> Decoded:
        """The compiled path over the values it can take (present; with a header, a known id, and a writer's schema
        encoding as the reader's); the others (few: null, a bad header, an unknown or resolved id) go value by value
        through fastavro's path, and take their places again."""
        found = spans(values, self._framed)
        eligible = found.present
        if self._framed:
            eligible = found.has_id.copy()
            for schema_id in np.unique(found.ids[found.has_id]).tolist():
                if not self._fast_id(schema_id):
                    eligible &= found.ids != schema_id
        columns, bad, fast_errors = plan.decode(found.data, found.starts, found.ends, eligible)
        errors = {i: f"{self.format_label}: {message}" for i, message in fast_errors.items()}
        if columns is None:  # a column of the batch would pass 2 GiB: value by value
            return super().decode(values)
        return merge(values, columns, bad, errors, np.flatnonzero(~eligible), found, super().decode)

    def _fast_id(self, schema_id: int) -> bool:
        """Whether values of this schema id can take the compiled path: a known id whose writer's schema encodes as
        the reader's (else fastavro's path decodes them, or names their error)."""
        try:
            if self._known_ids is not None and not self._known_ids(schema_id):
                return False
            return self._writer(schema_id) is None
        except (WireError, ValueSchemaError):
            return False


# the node kinds of _avro_fast.pyx
K_NULL, K_BOOL, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_STRING, K_BYTES, K_FIXED, K_ENUM, K_RECORD = range(11)
K_DATE, K_TS_MILLIS, K_TS_MICROS = 11, 12, 13
_FAST_PRIMITIVES = {
    "null": K_NULL,
    "boolean": K_BOOL,
    "int": K_INT,
    "long": K_LONG,
    "float": K_FLOAT,
    "double": K_DOUBLE,
    "string": K_STRING,
    "bytes": K_BYTES,
}
_FAST_LOGICAL = {
    ("int", "date"): K_DATE,
    ("long", "timestamp-millis"): K_TS_MILLIS,
    ("long", "timestamp-micros"): K_TS_MICROS,
    ("long", "local-timestamp-millis"): K_TS_MILLIS,
    ("long", "local-timestamp-micros"): K_TS_MICROS,
    ("string", "uuid"): K_STRING,  # read as its string (parse drops it)
}
_VALUES = {
    K_BOOL: np.uint8,
    K_INT: np.int32,
    K_LONG: np.int64,
    K_FLOAT: np.float32,
    K_DOUBLE: np.float64,
    K_ENUM: np.int32,
    K_DATE: np.int32,
    K_TS_MILLIS: np.int64,
    K_TS_MICROS: np.int64,
}
_VARIABLE = (K_STRING, K_BYTES, K_FIXED)


class _Unsupported(Exception):
    """A schema node the compiled path does not decode."""


class _FastPlan:
    """A reader's schema as the compiled path's program: one node per schema node (the root record is node 0), in
    the order the bytes come; a named type used twice is two nodes (two columns)."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.nulls: list[int] = []  # the null branch of a [null, T] union; -1 when not a union
        self.arg: list[int] = []  # a fixed's size, an enum's symbol count
        self.first: list[int] = []
        self.count: list[int] = []
        self.children: list[int] = []
        self.paths: list[str] = []
        self.symbols: dict[int, list[str]] = {}
        self.types: dict[str, Any] = {}
        self.arrow: pa.StructType = pa.struct([])
        self.program: list[np.ndarray] = []

    @classmethod
    def of(cls, schema: Any, arrow: pa.StructType) -> _FastPlan | None:
        """The plan of a reader's schema; None when the compiled path cannot decode it."""
        plan = cls()
        try:
            plan._node(schema, None, "", -1)
        except _Unsupported:
            return None
        plan.arrow = arrow
        plan.program = [np.array(a, dtype=np.int64) for a in (plan.kind, plan.nulls, plan.arg, plan.first, plan.count)]
        plan.program.append(np.array(plan.children, dtype=np.int64))
        return plan

    def _new(self, kind: int, nulls: int, path: str, arg: int = 0) -> int:
        self.kind.append(kind)
        self.nulls.append(nulls)
        self.arg.append(arg)
        self.first.append(0)
        self.count.append(0)
        self.paths.append(path)
        return len(self.kind) - 1

    def _node(self, schema: Any, namespace: str | None, path: str, nulls: int) -> int:
        if isinstance(schema, str):
            if schema in _FAST_PRIMITIVES:
                return self._new(_FAST_PRIMITIVES[schema], nulls, path)
            for name in (_Names.full(schema, namespace), schema):
                if name in self.types:
                    return self._node(self.types[name], name.rpartition(".")[0] or None, path, nulls)
            raise _Unsupported(schema)
        if isinstance(schema, list):
            if nulls >= 0 or len(schema) != 2:
                raise _Unsupported("union")
            is_null = [b == "null" or (isinstance(b, dict) and b.get("type") == "null") for b in schema]
            if sum(is_null) != 1:
                raise _Unsupported("union")
            branch = is_null.index(True)
            return self._node(schema[1 - branch], namespace, path, branch)
        if not isinstance(schema, dict):
            raise _Unsupported(schema)
        kind, logical = schema.get("type"), schema.get("logicalType")
        if kind in _NAMED:
            fullname = _Names.full(str(schema.get("name", "")), schema.get("namespace", namespace))
            self.types[fullname] = schema
            namespace = fullname.rpartition(".")[0] or None
            path = path or ("" if fullname == TOP_LEVEL else fullname)
        if logical is not None:
            fast = _FAST_LOGICAL.get((str(kind), str(logical)))
            if fast is None:
                raise _Unsupported(logical)
            return self._new(fast, nulls, path)
        if kind in ("record", "error"):
            node = self._new(K_RECORD, nulls, path)
            fields = [
                self._node(f["type"], namespace, f"{path}.{f['name']}" if path else f["name"], -1)
                for f in schema.get("fields", [])
            ]
            self.first[node], self.count[node] = len(self.children), len(fields)
            self.children.extend(fields)
            return node
        if kind == "enum":
            node = self._new(K_ENUM, nulls, path, len(schema["symbols"]))
            self.symbols[node] = list(schema["symbols"])
            return node
        if kind == "fixed":
            return self._new(K_FIXED, nulls, path, int(schema["size"]))
        if isinstance(kind, (str, list, dict)) and kind not in ("array", "map"):
            return self._node(kind, namespace, path, nulls)
        raise _Unsupported(kind)

    def decode(
        self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray, eligible: np.ndarray
    ) -> tuple[pa.StructArray | None, np.ndarray, dict[int, str]]:
        """(the columns of every row, null where not eligible or bad; bad; the bad rows' errors): the columns are
        None when a string or bytes column of the batch would pass 2 GiB."""
        n, nodes = len(starts), len(self.kind)
        valid = np.zeros((nodes, n), dtype=np.uint8)
        vals = [np.zeros(n, _VALUES[k]) if k in _VALUES else None for k in self.kind]
        offs = [np.empty(n + 1, np.int32) if k in _VARIABLE else None for k in self.kind]
        bad = np.zeros(n, dtype=np.uint8)
        code = np.zeros(n, dtype=np.int8)
        pos, node, val = (np.zeros(n, dtype=np.int64) for _ in range(3))
        kinds, nulls, args, firsts, counts, children = self.program
        datas = _avro_fast.decode(
            data,
            starts,
            ends,
            eligible.view(np.uint8),
            kinds,
            nulls,
            args,
            firsts,
            counts,
            children,
            valid,
            [None if v is None else v.view(np.uint8) for v in vals],
            offs,
            bad,
            code,
            pos,
            node,
            val,
        )
        if datas is None:
            return None, bad.view(bool), {}
        errors = {
            i: self._error(int(code[i]), int(pos[i]), int(node[i]), int(val[i]), data, int(starts[i]))
            for i in np.flatnonzero(bad).tolist()
        }
        columns = self._array(0, self.arrow, valid, vals, offs, datas)
        return columns, bad.view(bool), errors

    def _array(
        self,
        node: int,
        t: pa.DataType,
        valid: np.ndarray,
        vals: list[np.ndarray | None],
        offs: list[np.ndarray | None],
        datas: list[bytes | None],
    ) -> pa.Array:
        kind, n = self.kind[node], valid.shape[1]
        if kind == K_NULL:
            return pa.nulls(n)
        mask = pa.py_buffer(np.packbits(valid[node].view(bool), bitorder="little"))
        if kind == K_RECORD:
            fields = range(self.first[node], self.first[node] + self.count[node])
            children = [
                self._array(self.children[f], t.field(i).type, valid, vals, offs, datas) for i, f in enumerate(fields)
            ]
            return pa.Array.from_buffers(t, n, [mask], children=children)
        if kind in _VARIABLE:
            buffers = [mask, pa.py_buffer(offs[node]), pa.py_buffer(datas[node])]
            return pa.Array.from_buffers(t, n, buffers)
        values = vals[node]
        assert values is not None
        if kind == K_BOOL:
            return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(np.packbits(values.view(bool), bitorder="little"))])
        if kind == K_ENUM:
            indices = pa.Array.from_buffers(pa.int32(), n, [mask, pa.py_buffer(values)])
            symbols = pa.array(self.symbols[node], pa.string())
            return pa.DictionaryArray.from_arrays(indices, symbols).dictionary_decode()
        return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(values)])

    def _error(self, code: int, pos: int, node: int, val: int, data: np.ndarray, start: int) -> str:
        """A bad value's error (the codes of _avro_fast.pyx), in the words of fastavro's path where it has them."""
        path = self.paths[node]
        if code == 1:
            return f"byte {pos}: truncated: the value ends inside a field"
        if code == 10:
            return f"byte {pos}: {val} bytes left after the record"
        if code == 5:
            try:
                bytes(data[start + val : start + pos]).decode("utf-8")
            except UnicodeDecodeError as err:
                return f"byte {pos}: {path}: {err}"
            return f"byte {pos}: {path}: not UTF-8"
        if code == 7:
            return f"not representable in its column: {path}: {val} is out of the int range"
        rule = {
            2: "a varint of more than 64 bits",
            3: f"union branch {val}: the union has 2 branches",
            4: f"enum index {val}: the enum has {self.arg[node]} symbols",
            6: f"a negative length {val}",
            8: f"date value out of range: {val} days",
            9: f"timestamp out of range: {val}",
        }.get(code, f"error {code}")
        return f"byte {pos}: {path}: {rule}"
