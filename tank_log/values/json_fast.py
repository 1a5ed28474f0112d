"""A fast acceptance check for the common JSON Schema keywords, compiled once from a schema into closures.

jsonschema stays the judge: this check only says "valid" for a value jsonschema accepts too (each keyword it
handles follows jsonschema's own rules, formats through the validator's own format checker), and a value it does
not accept goes to jsonschema, whose verdict and message count. A schema with any keyword outside the list below
gets no fast check at all (`compile_check` returns None): the value is then checked by jsonschema alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

# keywords that only annotate (no effect on validity)
_ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples", "$defs", "definitions"}
_HANDLED = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "anyOf",
    "$ref",
    "readOnly",
    "writeOnly",
    "deprecated",
}


class _Unsupported(Exception):
    """A keyword or form the fast check does not handle."""


def compile_check(schema: Mapping[str, Any], format_checker: Any, draft: str) -> Check | None:
    """The fast check of `schema` (`draft`: the validator's name, e.g. "Draft202012Validator"), or None when the
    schema uses anything it does not handle."""
    if draft == "Draft3Validator":  # `required` inside properties, `type: any`, ...
        return None
    modern = draft != "Draft4Validator"  # 1.0 is an integer; exclusiveMinimum/Maximum are numbers
    try:
        return _compile(schema, schema, format_checker, modern, frozenset())
    except _Unsupported:
        return None


def _is_type(kind: str, v: Any, modern: bool) -> bool:
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        if isinstance(v, bool):
            return False
        return isinstance(v, int) or (modern and isinstance(v, float) and v.is_integer())
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "object":
        return isinstance(v, dict)
    if kind == "array":
        return isinstance(v, list)
    if kind == "null":
        return v is None
    raise _Unsupported(kind)


def _equal(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema's enum and const use it: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return bool(a == b)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _types_check(kinds: list[str], modern: bool) -> Check:
    if len(kinds) == 1:  # the common case, without a call per kind
        kind = kinds[0]
        if kind == "string":
            return lambda v: isinstance(v, str)
        if kind == "integer" and not modern:
            return lambda v: isinstance(v, int) and not isinstance(v, bool)
        if kind == "integer":
            return lambda v: (
                (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
            )
        if kind == "object":
            return lambda v: isinstance(v, dict)
    return lambda v: any(_is_type(k, v, modern) for k in kinds)


def _all(checks: list[Check]) -> Check:
    """All of `checks`, in order (unrolled for the common short lists)."""
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda v: a(v) and b(v)
    if len(checks) == 3:
        a, b, c = checks
        return lambda v: a(v) and b(v) and c(v)

    def every(v: Any) -> bool:
        for check in checks:
            if not check(v):
                return False
        return True

    return every


def _bound_check(key: str, bound: float) -> Check:
    if key == "minimum":
        return lambda v: not _number(v) or v >= bound
    if key == "maximum":
        return lambda v: not _number(v) or v <= bound
    if key == "exclusiveMinimum":
        return lambda v: not _number(v) or v > bound
    return lambda v: not _number(v) or v < bound


def _length_check(key: str, n: Any) -> Check:
    if not isinstance(n, int) or isinstance(n, bool):
        raise _Unsupported(key)
    kind = str if key.endswith("Length") else list
    if key.startswith("min"):
        return lambda v: not isinstance(v, kind) or len(v) >= n
    return lambda v: not isinstance(v, kind) or len(v) <= n


def _compile(node: Any, root: Mapping[str, Any], fc: Any, modern: bool, refs: frozenset[str]) -> Check:
    if node is True or node == {}:
        return lambda v: True
    if not isinstance(node, Mapping):
        raise _Unsupported("boolean schema false or not a schema")
    unknown = set(node) - _HANDLED
    if "$id" in node and node is not root:
        unknown.add("$id (a nested base URI)")
    if unknown:
        raise _Unsupported(", ".join(sorted(unknown)))
    checks: list[Check] = []
    if "$ref" in node:
        ref = node["$ref"]
        if not modern and len(set(node) - _ANNOTATIONS) > 1:
            raise _Unsupported("$ref beside other keywords (ignored before draft 2019-09)")
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")) or ref in refs:
            raise _Unsupported("$ref")
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                raise _Unsupported("$ref")
            target = target[part]
        checks.append(_compile(target, root, fc, modern, refs | {ref}))
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        for k in kinds:
            _is_type(k, None, modern)  # an unknown type name: unsupported
        checks.append(_types_check(kinds, modern))
    if "enum" in node:
        options = list(node["enum"])
        checks.append(lambda v: any(_equal(v, o) for o in options))
    if "const" in node:
        const = node["const"]
        checks.append(lambda v: _equal(v, const))
    if "format" in node:
        fmt = node["format"]
        if fc is not None and fmt in fc.checkers:
            checks.append(lambda v: bool(fc.conforms(v, fmt)))
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in node:
            bound = node[key]
            if not _number(bound) or (key.startswith("exclusive") and not modern):
                raise _Unsupported(key)
            checks.append(_bound_check(key, bound))
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        if key in node:
            checks.append(_length_check(key, node[key]))
    if "required" in node:
        required = list(node["required"])

        def has_required(v: Any) -> bool:
            if isinstance(v, dict):
                for name in required:
                    if name not in v:
                        return False
            return True

        checks.append(has_required)
    props = node.get("properties", {})
    if props:
        subs = [(name, _compile(sub, root, fc, modern, refs)) for name, sub in props.items()]

        def properties(v: Any) -> bool:
            if isinstance(v, dict):
                for name, check in subs:
                    if name in v and not check(v[name]):
                        return False
            return True

        checks.append(properties)
    if "additionalProperties" in node:
        extra = node["additionalProperties"]
        known = set(props)
        if extra is False:
            checks.append(lambda v: not isinstance(v, dict) or all(k in known for k in v))
        elif extra is not True:
            sub = _compile(extra, root, fc, modern, refs)
            checks.append(lambda v: not isinstance(v, dict) or all(k in known or sub(x) for k, x in v.items()))
    if "items" in node:
        items = node["items"]
        if not isinstance(items, (Mapping, bool)):
            raise _Unsupported("items as a list (tuple validation)")
        if items is False:
            raise _Unsupported("items: false")
        item = _compile(items, root, fc, modern, refs)
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if "anyOf" in node:
        branches = [_compile(b, root, fc, modern, refs) for b in node["anyOf"]]
        checks.append(lambda v: any(b(v) for b in branches))
    return _all(checks)
