"""The Schema Registry client against a small registry of the tests' own: a real HTTP server on loopback speaking
the REST API's `GET /schemas/ids/{id}` (tank_log.values.registry)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fastavro
import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.errors import RunFailed, ValueSchemaError
from tank_log.values import ValueSpec, decoder_for
from tank_log.values.registry import RegistryUnavailable

DATA = os.path.join(ROOT, "tests", "data", "values")
SMALL, SMALL_V2 = os.path.join(DATA, "small.avsc"), os.path.join(DATA, "small_v2.avsc")


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


class _Registry(BaseHTTPRequestHandler):
    schemas: dict[int, dict] = {}
    requests: list[str] = []
    auth: str | None = None  # the Authorization header it expects, if any

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        prefix = "/schemas/ids/"
        if self.auth is not None and self.headers.get("Authorization") != self.auth:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith(prefix + "99"):
            time.sleep(1.0)  # slower than the client's timeout
        found = self.path.startswith(prefix) and self.schemas.get(int(self.path[len(prefix) :]))
        if self.path == prefix + "500":
            status, body = 500, {"error_code": 50001, "message": "Error in the backend data store"}
        elif found:
            status, body = 200, found
        else:
            status, body = 404, {"error_code": 40403, "message": "Schema not found"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry():
    _Registry.schemas = {
        1: {"schema": _text(SMALL)},  # the REST API leaves schemaType out for Avro
        2: {"schema": _text(SMALL_V2), "schemaType": "AVRO"},
        3: {"schema": 'syntax = "proto3"; message A { int32 a = 1; }', "schemaType": "PROTOBUF"},
    }
    _Registry.requests = []
    _Registry.auth = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def _avro(path: str, record: dict, schema_id: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(_text(path))), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def test_writer_schemas_come_from_the_registry_once_per_id(registry):
    decoder = decoder_for(ValueSpec("avro", schema_file=SMALL_V2, registry_url=registry + "/"))
    old = _avro(SMALL, {"user": 1, "page": "/a", "ms": 2}, 1)
    new = _avro(SMALL_V2, {"user_id": 3, "page": "/b", "ms": 4, "referrer": "r"}, 2)
    values = pa.array(
        [
            old,
            new,
            old,
            _avro(SMALL, {"user": 5, "page": "/c", "ms": 6}, 7),
            _avro(SMALL, {"user": 5, "page": "", "ms": 0}, 3),
        ]
    )
    out = decoder.decode(values)
    assert out.columns.to_pylist()[:3] == [
        {"user_id": 1, "page": "/a", "ms": 2, "referrer": None},
        {"user_id": 3, "page": "/b", "ms": 4, "referrer": "r"},
        {"user_id": 1, "page": "/a", "ms": 2, "referrer": None},
    ]
    assert out.bad.tolist() == [False, False, False, True, True] and out.schema_ids.to_pylist() == [1, 2, 1, 7, 3]
    errors = out.errors.to_pylist()
    assert errors[3] == f"avro: schema id 7: not in the schema registry ({registry}/schemas/ids/7: HTTP 404)"
    assert errors[4] == "avro: schema id 3: the registry holds a PROTOBUF schema, not AVRO"
    assert sorted(_Registry.requests) == ["/schemas/ids/1", "/schemas/ids/2", "/schemas/ids/3", "/schemas/ids/7"]
    decoder.decode(values)
    assert len(_Registry.requests) == 4  # asked once per id, a miss too (not once per value)


def test_a_registry_that_cannot_answer_stops_the_run_naming_url_and_id(registry):
    quick = ValueSpec("avro", schema_file=SMALL, registry_url=registry, registry_timeout=0.2)
    old = _avro(SMALL, {"user": 1, "page": "/a", "ms": 2}, 99)
    with pytest.raises(RegistryUnavailable, match=rf"^schema registry {registry}/schemas/ids/99: cannot reach it: "):
        decoder_for(quick).decode(pa.array([old]))
    with pytest.raises(RegistryUnavailable) as err:
        decoder_for(quick).decode(pa.array([_avro(SMALL, {"user": 1, "page": "/a", "ms": 2}, 500)]))
    assert str(err.value) == f"schema registry {registry}/schemas/ids/500: HTTP 500 Internal Server Error"
    assert isinstance(err.value, RunFailed)  # exit 1, nothing recorded past it
    # a port nobody listens on
    gone = ValueSpec("json", schema_file=os.path.join(DATA, "order.schema.json"), registry_url="http://127.0.0.1:9")
    with pytest.raises(
        RegistryUnavailable, match=r"^schema registry http://127\.0\.0\.1:9/schemas/ids/1: cannot reach"
    ):
        decoder_for(gone).decode(pa.array([b"\x00\x00\x00\x00\x01{}"]))


def test_a_registry_url_with_a_key_and_secret_sends_basic_auth_and_never_shows_the_secret(registry):
    import base64

    _Registry.auth = "Basic " + base64.b64encode(b"key:s@cret").decode()
    host = registry.removeprefix("http://")
    old = _avro(SMALL, {"user": 1, "page": "/a", "ms": 2}, 1)
    good = decoder_for(ValueSpec("avro", schema_file=SMALL, registry_url=f"http://key:s%40cret@{host}"))
    assert good.decode(pa.array([old])).columns.to_pylist() == [{"user": 1, "page": "/a", "ms": 2}]
    wrong = decoder_for(ValueSpec("avro", schema_file=SMALL, registry_url=f"http://key:wrong@{host}"))
    with pytest.raises(RegistryUnavailable) as err:
        wrong.decode(pa.array([old]))
    assert str(err.value) == f"schema registry {registry}/schemas/ids/1: HTTP 401 Unauthorized"
    with pytest.raises(ValueSchemaError, match=r"^schema registry ftp://key:\*\*\*@host: not an http\(s\) URL$"):
        decoder_for(ValueSpec("avro", schema_file=SMALL, registry_url="ftp://key:secret@host"))


def test_protobuf_message_indexes_are_checked_against_the_registrys_schema(registry):
    click = os.path.join(DATA, "click_v2.proto")
    _Registry.schemas[4] = {"schema": _text(click), "schemaType": "PROTOBUF"}
    _Registry.schemas[5] = {"schema": 'syntax = "proto3";\nimport "other.proto";\nmessage B { other.O o = 1; }\n',
                            "schemaType": "PROTOBUF"}  # fmt: skip
    decoder = decoder_for(ValueSpec("protobuf", schema_file=click, registry_url=registry))
    payload = decoder._cls(user_id=1, page="/p", ms=2).SerializeToString()
    values = [b"\x00" + i.to_bytes(4, "big") + b"\x00" + payload for i in (4, 3, 5)]
    out = decoder.decode(pa.array(values, pa.binary()))
    assert out.bad.tolist() == [False, True, False]  # id 5's schema imports another: no check, the reader decodes
    assert out.columns.to_pylist()[0] == {"user_id": 1, "page": "/p", "ms": 2, "referrer": None}
    assert out.errors.to_pylist()[1] == "protobuf: bytes 5-5: message indexes [0] name A, not shop.v1.Click"
