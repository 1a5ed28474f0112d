"""Where a Delta table lives: a local path, or an object-store URI (`s3://`, `gs://`, `az://`/`abfss://`, `file://`)
with the storage options delta-rs takes (credentials, endpoint: `AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, …; the
environment supplies what the options do not). Executors write Parquet through the pyarrow filesystem of the URI —
never `os` calls on table paths — and the driver commits through delta-rs with the same options.

Commits to S3 are safe against concurrent writers without a locking provider: delta-rs (>= 1.0) writes each log
entry with a conditional PUT (`If-None-Match`), which S3 (since 2024), MinIO, R2 and moto honour; a writer that
loses the race re-reads the log and retries at the next version (see README, Delta export on object storage).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tank_log.errors import JobConfigError, RunFailed

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure")


@dataclass(frozen=True)
class StoredFile:
    """A file under a table: its path relative to the table, size, last modification (ms since the epoch)."""

    rel: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class TableLocation:
    """A Delta table's URI (local tables: an absolute path) and its storage options."""

    uri: str
    options: dict[str, str] = field(default_factory=dict, repr=False)  # may hold credentials

    @classmethod
    def of(cls, table: str, options: dict[str, str] | None = None) -> TableLocation:
        """Raises:
        ValueError: an unsupported URI scheme, or a local path under a file.
        """
        scheme = urlparse(table).scheme if "://" in table else ""
        if scheme == "file":
            table = urlparse(table).path
        elif scheme and scheme not in OBJECT_STORES:
            raise ValueError(
                f"table {table}: unsupported scheme {scheme}:// (use a path, file://, s3://, gs://, az://)"
            )
        uri = table if scheme and scheme != "file" else os.path.abspath(table)
        if "://" not in uri:  # a local table: no file where a directory of its path must be
            at = uri
            while not os.path.lexists(at) and os.path.dirname(at) != at:
                at = os.path.dirname(at)
            if os.path.lexists(at) and not os.path.isdir(at):
                raise ValueError(f"table {uri}: {at} is not a directory")
        return cls(uri, {k.upper(): str(v) for k, v in (options or {}).items()})

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    def __str__(self) -> str:  # never the options: they hold credentials
        return self.uri

    def filesystem(self) -> tuple[Any, str]:
        """(pyarrow FileSystem, the table's root within it); made once per location, so an executor writing many
        files connects once."""
        return self._filesystem

    @cached_property
    def _filesystem(self) -> tuple[Any, str]:
        from pyarrow import fs

        if self.is_local:
            return fs.LocalFileSystem(), self.uri
        parsed = urlparse(self.uri)
        root = f"{parsed.netloc}{parsed.path}".rstrip("/")
        if parsed.scheme in ("s3", "s3a"):
            return fs.S3FileSystem(**self._s3_options()), root
        if parsed.scheme in ("az", "abfs", "abfss", "azure"):
            account = self._option("AZURE_STORAGE_ACCOUNT_NAME") or parsed.netloc.partition("@")[2].split(".")[0]
            container = parsed.netloc.partition("@")[0]
            return (
                fs.AzureFileSystem(account_name=account, account_key=self._option("AZURE_STORAGE_ACCOUNT_KEY")),
                f"{container}{parsed.path}".rstrip("/"),
            )
        filesystem, _ = fs.FileSystem.from_uri(self.uri)  # gs://: Google's default credentials
        return filesystem, root

    def _option(self, *names: str) -> str | None:
        for name in names:
            value = self.options.get(name) or os.environ.get(name)
            if value:
                return value
        return None

    def _s3_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for arg, names in (
            ("access_key", ("AWS_ACCESS_KEY_ID",)),
            ("secret_key", ("AWS_SECRET_ACCESS_KEY",)),
            ("session_token", ("AWS_SESSION_TOKEN",)),
            ("region", ("AWS_REGION", "AWS_DEFAULT_REGION")),
        ):
            value = self._option(*names)
            if value:
                out[arg] = value
        endpoint = self._option("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
        if endpoint:
            parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            out["endpoint_override"] = parsed.netloc
            out["scheme"] = parsed.scheme
        return out

    def spark_path(self) -> str:
        """The table's path for Spark's Delta reader and writer: `s3://` through Hadoop's s3a filesystem
        (hadoop-aws, among Delta's jars: `tank_spark/jars.py`)."""
        parsed = urlparse(self.uri)
        return self.uri.replace("s3://", "s3a://", 1) if parsed.scheme == "s3" else self.uri

    def spark_options(self) -> dict[str, str]:
        """These storage options as the Hadoop settings delta-spark takes per read or write (its `fs.`-prefixed
        options): the s3a endpoint, credentials and region; the environment supplies the rest (s3a reads
        `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` itself). Other stores: Spark's own configuration."""
        if urlparse(self.uri).scheme not in ("s3", "s3a"):
            return {}
        out = {}
        for key, names in (
            ("fs.s3a.access.key", ("AWS_ACCESS_KEY_ID",)),
            ("fs.s3a.secret.key", ("AWS_SECRET_ACCESS_KEY",)),
            ("fs.s3a.session.token", ("AWS_SESSION_TOKEN",)),
            ("fs.s3a.endpoint.region", ("AWS_REGION", "AWS_DEFAULT_REGION")),
        ):
            value = self._option(*names)
            if value:
                out[key] = value
        endpoint = self._option("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
        if endpoint:  # an S3-compatible server (MinIO, moto): path-style requests, plain HTTP if it says so
            out["fs.s3a.endpoint"] = endpoint
            out["fs.s3a.path.style.access"] = "true"
            out["fs.s3a.connection.ssl.enabled"] = str(not endpoint.startswith("http://")).lower()
        return out

    def open_parquet(self, rel: str, schema: pa.Schema) -> pq.ParquetWriter:
        """A `pyarrow.parquet.ParquetWriter` writing a Parquet file at `rel` under the table (close it to finish)."""
        import pyarrow.parquet as pq

        filesystem, root = self.filesystem()
        path = f"{root}/{rel}"
        filesystem.create_dir(path.rpartition("/")[0], recursive=True)
        return pq.ParquetWriter(path, schema, filesystem=filesystem, compression="snappy")

    def size(self, rel: str) -> int:
        """The size in bytes of the file at `rel` under the table."""
        filesystem, root = self.filesystem()
        size: int = filesystem.get_file_info(f"{root}/{rel}").size
        return size

    def data_files(self) -> list[StoredFile]:
        """Every file under the table outside `_delta_log/` (referenced or not), as stored now."""
        from pyarrow import fs

        filesystem, root = self.filesystem()
        selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
        out = []
        for info in filesystem.get_file_info(selector):
            rel = info.path[len(root) :].lstrip("/")
            if info.type == fs.FileType.File and not rel.startswith("_delta_log/"):
                mtime = info.mtime.timestamp() * 1000 if info.mtime is not None else 0
                out.append(StoredFile(rel, info.size, int(mtime)))
        return out

    def delete(self, rels: list[str]) -> None:
        """Delete files under the table (missing ones are fine)."""
        from pyarrow import fs

        filesystem, root = self.filesystem()
        for rel in rels:
            path = f"{root}/{rel}"
            if filesystem.get_file_info(path).type != fs.FileType.NotFound:
                filesystem.delete_file(path)

    def open(self) -> DeltaTable | None:
        """The Delta table at its latest version; None if there is none."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.options or None)
        except TableNotFoundError:
            return None
        except DeltaError as err:  # e.g. a table delta-spark made with column mapping
            raise JobConfigError(f"delta-rs cannot read the table {self}: {err}{self._features_hint()}") from None

    def _features_hint(self) -> str:
        """The table features its log's latest protocol lists (what delta-rs may not support), read from the commit
        files themselves; "" when there are none or they cannot be read."""
        import json

        from pyarrow import fs

        try:
            filesystem, root = self.filesystem()
            log_dir = f"{root}/_delta_log"
            commits = sorted(
                i.path
                for i in filesystem.get_file_info(fs.FileSelector(log_dir))
                if i.path.endswith(".json") and i.base_name[:20].isdigit()
            )
            protocol, config = None, None
            for path in commits:
                with filesystem.open_input_stream(path) as f:
                    for line in f.read().decode().splitlines():
                        action = json.loads(line) if line.strip() else {}
                        protocol = action.get("protocol", protocol)
                        config = action["metaData"].get("configuration", config) if "metaData" in action else config
        except (OSError, ValueError, KeyError):
            return ""
        if protocol is None:
            return ""
        features = sorted(set(protocol.get("readerFeatures") or ()) | set(protocol.get("writerFeatures") or ()))
        mode = (config or {}).get("delta.columnMapping.mode", "none")
        out = f" (table features: {', '.join(features) or 'none'}"
        return out + (f"; delta.columnMapping.mode={mode})" if mode != "none" else ")")

    def existing(self) -> DeltaTable:
        """The Delta table at its latest version, which this run created or planned against.

        Raises:
            RunFailed: there is none any more (removed while the run worked).
        """
        table = self.open()
        if table is None:
            raise RunFailed(f"the Delta table {self} is gone (removed while this run worked)")
        return table
