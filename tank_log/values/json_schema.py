"""JSON values checked against a JSON Schema (jsonschema, its validator compiled once), typed by the schema.

Types: object with properties → struct (required properties not null unless their type allows null), object with
only additionalProperties → map<string, …>, array → list, string → string (format date-time → timestamp[us, UTC],
format date → date32), integer → int64, number → float64, boolean → bool; a type list or anyOf/oneOf of null and
one type → that type, nullable; of several types → a struct of the branches (named by type); a schema with no type
(or `{}`) → the value's JSON text. Local `$ref`s (`#/$defs/…`, `#/definitions/…`) resolve; a recursive one cannot
be a column. A value that is not JSON or fails the schema is bad, with the validator's path and rule.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pyarrow as pa

from tank_log.errors import ValueSchemaError
from tank_log.values.json_fast import compile_check
from tank_log.values.spec import BatchDecoder, ValueSpec, WireError, require_file

Convert = Callable[[Any], Any]
_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def load_schema(path: str) -> dict[str, Any]:
    """A JSON Schema file, checked against its metaschema; ValueSchemaError naming the file and the rule."""
    require_file(path, "JSON Schema file")
    try:
        with open(path, encoding="utf-8") as fh:
            schema = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueSchemaError(f"{path}: not a JSON Schema (JSON): {err}") from None
    return check_schema(schema, path)


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """`schema` when it is a valid JSON Schema object (its `$schema`'s draft, else the latest)."""
    if not isinstance(schema, dict):
        raise ValueSchemaError(f"{where}: not a JSON Schema: the top level must be an object")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as err:
        raise ValueSchemaError(f"{where}: not a valid JSON Schema: {_describe(err)}") from None
    return schema


def _describe(err: jsonschema.ValidationError | jsonschema.SchemaError) -> str:
    """`$.a[0].b: <message> (<keyword>)`, on one line."""
    path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    message = " ".join(str(err.message).split())
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{path}: {message} ({err.validator})"


def arrow_type(schema: Mapping[str, Any], where: str) -> tuple[pa.StructType, Convert | None]:
    """(Arrow struct, converter of a parsed value or None) of a schema whose top level is an object."""
    t, _, conv = _walk(schema, schema, where, "$", frozenset())
    if not pa.types.is_struct(t):
        raise ValueSchemaError(f"{where}: the top level must be an object with properties (the columns), not {t}")
    return t, conv


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any], where: str, seen: frozenset[str]) -> tuple[Any, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node, seen
    if not ref.startswith("#"):
        raise ValueSchemaError(f"{where}: $ref {ref}: only local references (#/...) are supported")
    if ref in seen:
        raise ValueSchemaError(f"{where}: $ref {ref} is recursive: a table column cannot hold it")
    target: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, Mapping) or part not in target:
            raise ValueSchemaError(f"{where}: $ref {ref} points at nothing")
        target = target[part]
    return _resolve(target, root, where, seen | {ref})


def _types(node: Mapping[str, Any]) -> list[Any]:
    """The branches of a node: its type list, or its anyOf/oneOf schemas."""
    t = node.get("type")
    if isinstance(t, list):
        return [{**node, "type": x} for x in t]
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and t is None:
            return list(node[key])
    return [node]


def _is_null(node: Any) -> bool:
    return isinstance(node, Mapping) and node.get("type") == "null"


def _walk(
    node: Any, root: Mapping[str, Any], where: str, path: str, seen: frozenset[str]
) -> tuple[pa.DataType, bool, Convert | None]:
    """(Arrow type, nullable, converter or None) of a schema node."""
    if node is True or node == {}:
        return pa.string(), True, _json_text
    if not isinstance(node, Mapping):
        raise ValueSchemaError(f"{where}: {path}: not a schema: {json.dumps(node)[:80]}")
    node, seen = _resolve(node, root, where, seen)
    branches = _types(node)
    if len(branches) > 1:
        nullable = any(_is_null(b) for b in branches)
        rest = [b for b in branches if not _is_null(b)]
        if len(rest) == 1:
            t, _, conv = _walk(rest[0], root, where, path, seen)
            return t, True, _nullable(conv)
        fields: list[pa.Field] = []
        convs: list[Convert | None] = []
        tests: list[Callable[[Any], bool]] = []
        for b in rest:
            b, bseen = _resolve(b, root, where, seen) if isinstance(b, Mapping) else (b, seen)
            t, _, conv = _walk(b, root, where, path, bseen)
            name = str(b.get("type", "value")) if isinstance(b, Mapping) else "value"
            while name in [f.name for f in fields]:
                name += "_"
            fields.append(pa.field(name, t))
            convs.append(conv)
            tests.append(_python_test(b.get("type") if isinstance(b, Mapping) else None))
        return pa.struct(fields), nullable, _union([f.name for f in fields], tests, convs)
    kind = node.get("type")
    if kind is None and "properties" in node:
        kind = "object"
    if kind == "null":
        return pa.null(), True, None
    if kind == "object":
        props = node.get("properties")
        if not props:
            extra = node.get("additionalProperties")
            if isinstance(extra, Mapping) and extra:
                vt, vnull, vconv = _walk(extra, root, where, f"{path}.*", seen)
                return pa.map_(pa.string(), pa.field("value", vt, nullable=vnull)), False, _map(vconv)
            return pa.string(), False, _json_text
        required = set(node.get("required", []))
        props_fields: list[pa.Field] = []
        props_convs: list[tuple[str, Convert]] = []
        for name, sub in props.items():
            t, nullable, conv = _walk(sub, root, where, f"{path}.{name}", seen)
            props_fields.append(pa.field(name, t, nullable=nullable or name not in required))
            if conv is not None:
                props_convs.append((name, conv))
        return pa.struct(props_fields), False, _record(props_convs)
    if kind == "array":
        items = node.get("items")
        if not isinstance(items, Mapping) or not items:
            return pa.list_(pa.field("element", pa.string())), False, _list(_json_text)
        it, inull, iconv = _walk(items, root, where, f"{path}[]", seen)
        return pa.list_(pa.field("element", it, nullable=inull)), False, _list(iconv)
    if kind == "string":
        fmt = node.get("format")
        if fmt == "date-time":
            return pa.timestamp("us", tz="UTC"), False, _timestamp
        if fmt == "date":
            return pa.date32(), False, dt.date.fromisoformat
        return pa.string(), False, None
    if kind == "integer":
        return pa.int64(), False, _integer
    if kind in _SCALARS:
        return _SCALARS[kind], False, None
    if kind is None:  # no type: enum, const or anything: the JSON text
        return pa.string(), True, _json_text
    raise ValueSchemaError(f"{where}: {path}: unknown JSON Schema type {kind!r}")


def _json_text(v: Any) -> Any:
    return None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _timestamp(v: Any) -> dt.datetime:
    t = dt.datetime.fromisoformat(v)
    if t.tzinfo is None:
        raise WireError(f"date-time {v!r} has no time zone offset (RFC 3339)")
    # in UTC: pyarrow ignores an offset where PYARROW_IGNORE_TIMEZONE is set, as pyspark.pandas sets it in the process
    return t.astimezone(dt.UTC)


def _integer(v: Any) -> Any:
    return int(v) if isinstance(v, float) else v  # 1.0 is an integer to JSON Schema


def _python_test(kind: Any) -> Callable[[Any], bool]:
    return {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: type(v) is int or (isinstance(v, float) and v.is_integer()),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }.get(kind, lambda v: True)


def _nullable(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else conv(v)


def _union(names: list[str], tests: list[Callable[[Any], bool]], convs: list[Convert | None]) -> Convert:
    def branch(v: Any) -> Any:
        if v is None:
            return None
        for name, test, conv in zip(names, tests, convs, strict=True):
            if test(v):
                return {name: v if conv is None else conv(v)}
        raise WireError(f"a value of no branch: {type(v).__name__}")

    return branch


def _record(convs: list[tuple[str, Convert]]) -> Convert | None:
    if not convs:
        return None

    def record(v: Any) -> Any:
        if v is None:
            return None
        out = dict(v)
        for name, conv in convs:
            if name in out:
                out[name] = conv(out[name])
        return out

    return record


def _list(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else [None if x is None else conv(x) for x in v]


def _map(conv: Convert | None) -> Convert | None:
    if conv is None:
        return None
    return lambda v: None if v is None else {k: None if x is None else conv(x) for k, x in v.items()}


class JsonSchemaDecoder(BatchDecoder):
    """JSON values validated against the spec's JSON Schema file and converted to its columns."""

    format_label = "json"

    def __init__(self, spec: ValueSpec, fetch: Callable[[int], str] | None = None) -> None:
        """`fetch(id)` asks a registry whether an id exists (ids not in `spec.schema_ids`): the reader's schema
        decodes every id (Protobuf by field number, JSON by name)."""
        self._ids = dict(spec.schema_ids)
        path = spec.schema_file or (self._ids[max(self._ids)] if self._ids else None)
        if path is None:
            raise ValueSchemaError("json: a JSON Schema file is needed for the columns")
        schema = load_schema(path)
        for other in set(self._ids.values()) - {path}:  # a missing or bad writer file is a configuration error
            load_schema(other)
        cls = jsonschema.validators.validator_for(schema)
        self._validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        # most values pass a fast check of the common keywords; jsonschema judges the rest (and names the error)
        self._accept = compile_check(schema, self._validator.format_checker, cls.__name__)
        self.arrow_type, self._convert = arrow_type(schema, path)
        super().__init__(spec, fetch)

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        try:
            value = json.loads(payload.decode("utf-8"))  # JSON is UTF-8 (RFC 8259, section 8.1)
        except UnicodeDecodeError as err:
            raise WireError(f"byte {err.start}: not UTF-8") from None
        except json.JSONDecodeError as err:
            raise WireError(f"line {err.lineno} column {err.colno}: not JSON: {err.msg}") from None
        if self._accept is None or not self._accept(value):
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
            if error is not None:
                raise WireError(_describe(error))
        return value if self._convert is None else self._convert(value)
