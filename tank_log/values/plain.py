"""The formats without a schema: `binary` (the bytes), `utf8` (text; invalid UTF-8 is bad), `json` (the JSON text,
checked to parse). One column, `value`."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tank_log.values.spec import BatchDecoder, Decoded, ValueSpec, WireError


class PlainDecoder(BatchDecoder):
    """One `value` column: binary for `binary`, string for `utf8` and `json`."""

    def __init__(self, spec: ValueSpec) -> None:
        self.format_label = spec.format
        value_type = pa.binary() if spec.format == "binary" else pa.string()
        self.arrow_type = pa.struct([pa.field("value", value_type)])
        super().__init__(spec)

    def decode(self, values: pa.BinaryArray | pa.LargeBinaryArray) -> Decoded:
        """Without a header to read, `binary` and valid `utf8` batches convert whole (no loop over values)."""
        if self._framed or self.spec.format == "json":
            return super().decode(values)
        value_type = self.arrow_type.field("value").type
        try:
            column = values.cast(value_type)  # utf8: Arrow checks the UTF-8 (an invalid value: the loop names it)
        except pa.ArrowInvalid:
            return super().decode(values)
        nulls = values.is_null()
        bad = nulls.to_numpy(zero_copy_only=False).astype(bool)
        errors = pc.if_else(nulls, pa.scalar(f"{self.format_label}: no value (null)"), pa.scalar(None, pa.string()))
        columns = pa.StructArray.from_arrays([column], fields=list(self.arrow_type), mask=nulls)
        return Decoded(columns, bad, errors, pa.nulls(len(values), pa.int32()))

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
