"""`decoder_for`: the one place that picks a value format's decoder (and checks its schema files, once)."""

from __future__ import annotations

from collections.abc import Callable

from tank_log.errors import ValueSchemaError
from tank_log.values.plain import PlainDecoder
from tank_log.values.spec import ValueDecoder, ValueSpec


def decoder_for(spec: ValueSpec) -> ValueDecoder:
    """The decoder of `spec`'s format. Raises ValueSchemaError (exit 2) for a missing or bad schema file, a message
    name the schema does not hold, or a format that needs a schema and has none."""
    fetch: Callable[[int], str] | None = None
    if spec.registry_url is not None:
        from tank_log.values.registry import RegistryClient

        fetch = RegistryClient(spec.registry_url, spec.format, timeout=spec.registry_timeout).schema_text
    if spec.format == "avro":
        from tank_log.values.avro import AvroDecoder

        return AvroDecoder(spec, fetch)
    if spec.format == "protobuf":
        from tank_log.values.protobuf import ProtobufDecoder

        return ProtobufDecoder(spec, fetch)
    if spec.format == "json" and (spec.schema_file is not None or spec.schema_ids):
        from tank_log.values.json_schema import JsonSchemaDecoder

        return JsonSchemaDecoder(spec, fetch)
    if spec.format in ("binary", "utf8", "json"):
        return PlainDecoder(spec)
    raise ValueSchemaError(f"unknown value format {spec.format!r} (binary, utf8, json, avro, protobuf)")
