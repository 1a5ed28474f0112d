"""Schema evolution of a typed table: which changes of a value schema a table follows (`evolve`), and a batch
decoded with a newer schema put into the table's columns (`conform`).

Compatible: an added field (a nullable column; older rows hold null), a removed field (its column stays,
nullable), a widened type (int8 → int16 → int32 → int64, float32 → float64, any int → float64, a decimal with more
digits at the same scale), a narrowed one (the column keeps its wider type), a nullable field made required or the
other way round (the column is nullable), a renamed field that is the same field (an Avro alias naming the
column, the same Protobuf field number): the column keeps its name. A field of a column's name is another field
when both have Protobuf numbers and they differ. Nested structs, lists and maps follow the same rules. Anything
else raises IncompatibleSchema naming the field's path (and a renamed field's new name) and both types.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from tank_log.errors import IncompatibleSchema
from tank_log.values.spec import ALIASES_KEY, NUMBER_KEY

_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


def evolve(table_type: pa.StructType, new_type: pa.StructType) -> pa.StructType:
    """The table's type merged with a new schema's (see the module); raises IncompatibleSchema(field, old, new)."""
    return _struct(table_type, new_type, "")


def _aliases(field: pa.Field) -> set[str]:
    raw = (field.metadata or {}).get(ALIASES_KEY)
    if not raw:
        return set()
    try:
        return {str(a).rpartition(".")[2] for a in json.loads(raw)}
    except (ValueError, TypeError):
        return set()


def _number(field: pa.Field) -> bytes | None:
    return (field.metadata or {}).get(NUMBER_KEY)


def _matches(targets: list[pa.Field], sources: list[pa.Field]) -> dict[int, int]:
    """target index → source index: the same name first (unless both have Protobuf numbers and they differ: another
    field), then an Avro alias, then the same Protobuf number."""
    out: dict[int, int] = {}
    used: set[int] = set()
    by_name = {f.name: i for i, f in enumerate(sources)}
    for ti, t in enumerate(targets):
        si = by_name.get(t.name)
        if si is not None and not _numbered_apart(t, sources[si]):
            out[ti] = si
            used.add(si)
    for ti, t in enumerate(targets):
        if ti in out:
            continue
        for si, s in enumerate(sources):
            if si in used:
                continue
            same_alias = t.name in _aliases(s) or s.name in _aliases(t)
            same_number = _number(t) is not None and _number(t) == _number(s)
            if same_alias or same_number:
                out[ti] = si
                used.add(si)
                break
    return out


def _numbered_apart(a: pa.Field, b: pa.Field) -> bool:
    """Whether both fields have Protobuf numbers, and not the same one."""
    return _number(a) is not None and _number(b) is not None and _number(a) != _number(b)


def _struct(old: pa.StructType, new: pa.StructType, path: str) -> pa.StructType:
    olds, news = list(old), list(new)
    matched = _matches(olds, news)
    fields = []
    for oi, o in enumerate(olds):
        if oi not in matched:  # removed from the new schema: the column stays, null from now on
            fields.append(o.with_nullable(True))
            continue
        n = news[matched[oi]]
        where = f"{path}.{o.name}" if path else o.name
        try:
            merged = _type(o.type, n.type, where)
        except IncompatibleSchema as err:
            if err.field != where or n.name == o.name:
                raise
            number = _number(n)  # renamed (an alias, a number): the new schema's field named too
            renamed = f"{where} (renamed {n.name}" + (f", number {number.decode()})" if number is not None else ")")
            raise IncompatibleSchema(renamed, err.old_type, err.new_type) from None
        metadata = {**(o.metadata or {}), **(n.metadata or {})} or None
        fields.append(pa.field(o.name, merged, nullable=o.nullable or n.nullable, metadata=metadata))
    taken = set(matched.values())
    names = {f.name for f in fields}
    for ni, n in enumerate(news):
        if ni not in taken:  # added: older rows hold null
            if n.name in names:
                where = f"{path}.{n.name}" if path else n.name
                raise IncompatibleSchema(where, "(a column renamed away)", n.type)
            fields.append(n.with_nullable(True))
    return pa.struct(fields)


def _type(old: pa.DataType, new: pa.DataType, path: str) -> pa.DataType:
    if old.equals(new):
        return old
    if pa.types.is_null(old):
        return new
    if pa.types.is_null(new):
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return _struct(old, new, path)
    if pa.types.is_map(old) and pa.types.is_map(new):
        key = _type(old.key_type, new.key_type, f"{path}.key")
        item = _type(old.item_type, new.item_type, f"{path}.value")
        nullable = old.item_field.nullable or new.item_field.nullable
        return pa.map_(key, pa.field(old.item_field.name, item, nullable=nullable))
    if _is_list(old) and _is_list(new):
        element = _type(old.value_type, new.value_type, f"{path}[]")
        nullable = old.value_field.nullable or new.value_field.nullable
        return pa.list_(pa.field(old.value_field.name, element, nullable=nullable))
    if old in _INTS and new in _INTS:
        return max(old, new, key=_INTS.index)
    if pa.types.is_floating(old) and pa.types.is_floating(new) and not pa.types.is_float16(old):
        return pa.float64()
    if (old in _INTS and pa.types.is_float64(new)) or (pa.types.is_float64(old) and new in _INTS):
        return pa.float64()
    if pa.types.is_decimal(old) and pa.types.is_decimal(new) and old.scale == new.scale:
        precision = max(old.precision, new.precision)
        return pa.decimal128(precision, old.scale) if precision <= 38 else pa.decimal256(precision, old.scale)
    raise IncompatibleSchema(path, old, new)


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def conform(columns: pa.Array, target: pa.DataType) -> pa.Array:
    """`columns` (decoded with a newer schema) in the table's type `target = evolve(table_type, decoded type)`:
    fields found by name, alias or field number, renamed, widened; a field the batch lacks is null."""
    if columns.type.equals(target):
        return columns
    if pa.types.is_struct(target) and pa.types.is_struct(columns.type):
        sources = list(columns.type)
        targets = list(target)
        matched = _matches(targets, sources)
        children = []
        for ti, t in enumerate(targets):
            if ti in matched:
                children.append(conform(columns.field(matched[ti]), t.type))
            else:
                children.append(pa.nulls(len(columns), type=t.type))
        mask = columns.is_null() if columns.null_count else None
        return pa.StructArray.from_arrays(children, fields=targets, mask=mask)
    if pa.types.is_map(target) and pa.types.is_map(columns.type):
        keys = conform(columns.keys, target.key_type)
        items = conform(columns.items, target.item_type)
        mask = columns.is_null() if columns.null_count else None
        return pa.MapArray.from_arrays(columns.offsets, keys, items, type=target, mask=mask)
    if _is_list(target) and _is_list(columns.type):
        values = conform(columns.values, target.value_type)
        mask = columns.is_null() if columns.null_count else None
        return pa.ListArray.from_arrays(columns.offsets, values, type=target, mask=mask)
    return pc.cast(columns, target)
