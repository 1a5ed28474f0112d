"""The formats without a schema: `binary` (the bytes), `utf8` (text; invalid UTF-8 is bad), `json` (the JSON text,
checked to parse). One column, `value`."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from tank_log.values.spec import BatchDecoder, ValueSpec, WireError


class PlainDecoder(BatchDecoder):
    """One `value` column: binary for `binary`, string for `utf8` and `json`."""

    def __init__(self, spec: ValueSpec) -> None:
        self.format_label = spec.format
        value_type = pa.binary() if spec.format == "binary" else pa.string()
        self.arrow_type = pa.struct([pa.field("value", value_type)])
        super().__init__(spec)

    def _decode_one(self, payload: bytes, schema_id: int | None) -> Any:
        if self.spec.format == "binary":
            return {"value": payload}
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as err:
            raise WireError(f"byte {err.start}: not UTF-8") from None
        if self.spec.format == "json":
            try:
                json.loads(text)
            except json.JSONDecodeError as err:
                raise WireError(f"line {err.lineno} column {err.colno}: not JSON: {err.msg}") from None
        return {"value": text}
