"""A small Confluent Schema Registry client: a schema's text by id (`GET /schemas/ids/{id}`), cached per id.

An id the registry does not have (HTTP 404) or holds for another format makes that value bad (its row's error);
a registry that cannot be reached, times out or fails (5xx) stops the run (RegistryUnavailable, exit 1): that is
no fault of the value, and dead-lettering every message for it would be wrong.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request

from tank_log.errors import RunFailed, ValueSchemaError
from tank_log.values.spec import WireError

_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON"}


class RegistryUnavailable(RunFailed):
    """The schema registry could not answer (unreachable, a timeout, a server error): the message names the URL
    and the schema id."""


def _shown(url: str) -> str:
    """The URL without a password (for messages)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


class RegistryClient:
    """`schema_text(id)`: the schema of an id, for values of `value_format` (the registry's schemaType checked)."""

    def __init__(self, url: str, value_format: str, timeout: float = 10.0) -> None:
        """`url` may hold a user and password (`https://KEY:SECRET@host`): sent as HTTP basic auth, never shown."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueSchemaError(f"schema registry {_shown(url)}: not an http(s) URL")
        self._auth: str | None = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            secret = urllib.parse.unquote(parts.password or "")
            self._auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode("ascii")
            netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
            parts = parts._replace(netloc=netloc)
        self.url = urllib.parse.urlunsplit(parts).rstrip("/")
        self.expected = _TYPES.get(value_format, "AVRO")
        self.timeout = timeout
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def schema_text(self, schema_id: int) -> str:
        """The schema's text; WireError for an id it does not hold (or of another format), RegistryUnavailable
        when it cannot answer."""
        with self._lock:
            found = self._cache.get(schema_id)
        if found is not None:
            return found
        url = f"{self.url}/schemas/ids/{schema_id}"
        request = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - an http(s) URL
                body = response.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise WireError(f"schema id {schema_id}: not in the schema registry ({url}: HTTP 404)") from None
            raise RegistryUnavailable(f"schema registry {url}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise RegistryUnavailable(f"schema registry {url}: cannot reach it: {reason}") from None
        try:
            answer = json.loads(body)
            text = answer["schema"]
            kind = answer.get("schemaType", "AVRO")  # the REST API leaves it out for Avro
        except (ValueError, KeyError, TypeError):
            raise RegistryUnavailable(f"schema registry {url}: not a Schema Registry answer: {body[:80]!r}") from None
        if not isinstance(text, str):
            raise RegistryUnavailable(f"schema registry {url}: not a Schema Registry answer: {body[:80]!r}")
        if kind != self.expected:
            raise WireError(f"schema id {schema_id}: the registry holds a {kind} schema, not {self.expected}")
        with self._lock:
            self._cache[schema_id] = text
        return text
