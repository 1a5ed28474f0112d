"""Where a table lives, and what a table of any format gives the export, retention's guard, stats and the import
(`LakeTable`; `FORMATS` names the module implementing each format).

A location is a local path, or an object-store URI (`s3://`, `gs://`, `az://`/`abfss://`, `file://`), or an Iceberg
table's name in a REST catalog (`namespace.table`, `RestCatalog`: the catalog says where its files are), with its
storage options (credentials, endpoint: `AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, …; the environment supplies what
the options do not), and its format. Executors write Parquet through the pyarrow filesystem of the URI — never `os`
calls on table paths — and the driver commits through the format's implementation with the same options.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from tank_log.errors import JobConfigError, RunFailed

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from tank_log.lakehouse.table import DataFile, Recorded, RunCommit, UpkeepStep

TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")  # namespace(s).table, in a catalog
METADATA_DIRS = ("_delta_log/", "metadata/")  # the formats' own files under a table: never data files
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure")


@dataclass(frozen=True)
class StoredFile:
    """A file under a table: its path relative to the table, size, last modification (ms since the epoch)."""

    rel: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class RestCatalog:
    """An Iceberg REST catalog (`export.catalog: {type: rest, ...}`): its endpoint, the warehouse asked of it, and
    its credentials (a bearer `token`, or an OAuth2 `credential` `client_id:secret` it exchanges for one)."""

    uri: str
    warehouse: str | None = None
    token: str | None = field(default=None, repr=False)
    credential: str | None = field(default=None, repr=False)

    def __str__(self) -> str:  # never the credentials
        return self.uri


Catalog = str | RestCatalog  # Iceberg's catalog: a SQL catalog's SQLAlchemy URI, or a REST catalog


def parse_catalog(value: str | Mapping[str, Any] | RestCatalog | None, where: str = "export.catalog") -> Catalog | None:
    """A catalog setting as the config or a flag gives it: a SQLAlchemy URI (a SQL catalog, kept as it is), an
    `http(s)://` URI (a REST catalog), or a mapping `{type: rest, uri, warehouse, token, credential}` (or `{type:
    sql, uri}`).

    Raises:
        JobConfigError: one line naming `where` and what is wrong.
    """
    if value is None or isinstance(value, RestCatalog):
        return value
    if isinstance(value, str):
        return RestCatalog(value) if value.startswith(("http://", "https://")) else value
    kind, keys = value.get("type"), set(value)
    allowed = {"rest": {"type", "uri", "warehouse", "token", "credential"}, "sql": {"type", "uri"}}
    if kind not in allowed:
        raise JobConfigError(f"{where}.type: {kind!r}: expected rest or sql")
    if keys - allowed[kind]:
        raise JobConfigError(f"{where}: unknown key(s) {', '.join(sorted(keys - allowed[kind]))} for type {kind}")
    fields = {k: value[k] for k in keys - {"type"}}
    for k, v in fields.items():
        if not isinstance(v, str) or not v:
            raise JobConfigError(f"{where}.{k}: expected a non-empty string")
    if "uri" not in fields:
        raise JobConfigError(f"{where}.uri: required for type {kind}")
    if kind == "sql":
        return str(fields["uri"])
    if not fields["uri"].startswith(("http://", "https://")):
        raise JobConfigError(f"{where}.uri {fields['uri']!r}: a REST catalog's URI is http:// or https://")
    if "token" in fields and "credential" in fields:
        raise JobConfigError(f"{where}: token or credential, not both")
    return RestCatalog(**fields)


# a REST catalog named by a flag (`--catalog http://…`): its warehouse and credentials come from the environment,
# never from a command line, where `ps` shows them to every user of the host
CATALOG_ENV = {
    "warehouse": "TANK_LOG_CATALOG_WAREHOUSE",
    "token": "TANK_LOG_CATALOG_TOKEN",
    "credential": "TANK_LOG_CATALOG_CREDENTIAL",
}


def catalog_setting(flag: str | None, configured: Catalog | None, fmt: str, where: str = "--catalog") -> Catalog | None:
    """The catalog a command uses: its flag (`where`) over the configured one. A flag's `http(s)://` URI is a REST
    catalog whose warehouse, token or credential come from `CATALOG_ENV`'s variables; any other flag is a SQL
    catalog's SQLAlchemy URI.

    Raises:
        JobConfigError: a catalog for a format other than iceberg, or bad settings (one line naming `where`).
    """
    catalog = configured
    if flag:
        catalog = parse_catalog(flag, where)
        if isinstance(catalog, RestCatalog):
            from_env = {k: os.environ[v] for k, v in CATALOG_ENV.items() if os.environ.get(v)}
            catalog = parse_catalog({"type": "rest", "uri": flag, **from_env}, where)
    if catalog is not None and fmt != "iceberg":
        raise JobConfigError(f"{where}: a catalog goes with format iceberg (the table's format is {fmt})")
    return catalog


def locate(
    table: str,
    options: dict[str, str] | None = None,
    fmt: str = "delta",
    catalog: Catalog | None = None,
    source: str | None = None,
) -> TableLocation:
    """`TableLocation.of`, its refusals as `JobConfigError` (exit 2).

    Raises:
        JobConfigError: the table is not a path, URI or (in a REST catalog) a name.
        RunFailed: the REST catalog cannot be reached.
    """
    try:
        return TableLocation.of(table, options, fmt, catalog, source)
    except ValueError as err:
        raise JobConfigError(str(err)) from None


@dataclass(frozen=True)
class TableLocation:
    """A table's URI (local tables: an absolute path), its storage options and its format (`FORMATS`)."""

    uri: str
    options: dict[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    format: str = "delta"
    catalog: Catalog | None = field(default=None, repr=False)  # Iceberg's (a SQL catalog's URI may hold a password)
    source: str | None = None  # the broker whose partitions this run reads or writes (`table.app_id`)
    name: str | None = None  # the table's name in its REST catalog (`namespace.table`); `uri`: where it says it is

    @classmethod
    def of(
        cls,
        table: str,
        options: dict[str, str] | None = None,
        fmt: str = "delta",
        catalog: Catalog | None = None,
        source: str | None = None,
    ) -> TableLocation:
        """`table`: a path or URI; with a `RestCatalog`, the table's name there, located through the catalog (where
        the table is, or where the catalog would create it).

        Raises:
            ValueError: an unsupported URI scheme, a local path under a file, or not a name in a REST catalog.
            RunFailed: the REST catalog cannot be reached.
        """
        if isinstance(catalog, RestCatalog):
            if fmt != "iceberg":
                raise ValueError(f"table {table}: a REST catalog holds Iceberg tables (format iceberg)")
            if not TABLE_NAME.fullmatch(table):
                raise ValueError(
                    f"table {table!r}: in a REST catalog a table is named namespace.table (letters, digits, '_')"
                )
            from tank_log.lakehouse.iceberg import located

            uri = located(table, catalog)
            uri = urlparse(uri).path if uri.startswith("file://") else uri
            return cls(uri, {k.upper(): str(v) for k, v in (options or {}).items()}, fmt, catalog, source, table)
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
        return cls(uri, {k.upper(): str(v) for k, v in (options or {}).items()}, fmt, catalog, source)

    @property
    def partition_columns_in_files(self) -> bool:
        """Whether this table's data files hold its partition columns (`PARTITION_COLUMNS_IN_FILES`)."""
        return self.format in PARTITION_COLUMNS_IN_FILES

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
        """Every file under the table outside its metadata directories (referenced or not), as stored now."""
        from pyarrow import fs

        filesystem, root = self.filesystem()
        selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
        out = []
        for info in filesystem.get_file_info(selector):
            rel = info.path[len(root) :].lstrip("/")
            if info.type == fs.FileType.File and not rel.startswith(METADATA_DIRS):
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

    def open(self) -> LakeTable | None:
        """The table at its latest version, through its format's implementation; None if there is none.

        Raises:
            JobConfigError: the format's implementation cannot read the table.
        """
        return implementation(self.format).open(self)

    def existing(self) -> LakeTable:
        """The table at its latest version, which this run created or planned against.

        Raises:
            RunFailed: there is none any more (removed while the run worked).
        """
        table = self.open()
        if table is None:
            raise RunFailed(f"the table {self} is gone (removed while this run worked)")
        return table

    def create(
        self, schema: pa.Schema, partition_by: tuple[str, ...], configuration: dict[str, str] | None = None
    ) -> LakeTable:
        """A new, empty table here (an error if one exists); `configuration`: keys of ours it records (`properties`)."""
        return implementation(self.format).create(self, schema, partition_by, configuration)


class LakeTable(Protocol):
    """A table of one format at one location, at the version it was read at (`refresh` reads the latest)."""

    location: TableLocation

    @property
    def table_id(self) -> str:
        """The table's own id (a UUID string), which names its partitions' recorded versions (`app_id`)."""
        ...

    def version(self) -> int:
        """The table version (snapshot) this object reads."""
        ...

    def refresh(self) -> None:
        """Read the table's latest version."""
        ...

    def app_id(self, topic: str, partition: int) -> str:
        """The id the partition's recorded version is written under in this table: its source's (`location.source`;
        `app_id`)."""
        ...

    def recorded(self, topic: str, partition: int) -> Recorded:
        """The partition's recorded version (of `location.source`; `candidate_ids`), checked against the table's
        history: the commit that recorded it must still be in the table's lineage (not undone by a Delta RESTORE
        or an Iceberg rollback); otherwise the version of the last commit that is.

        Raises:
            TableUnreadable: the history needed to check it cannot be read.
        """
        ...

    def recorded_version(self, topic: str, partition: int) -> int | None:
        """The last seq of `topic`/`partition` the table holds (None: never exported): `recorded(...).version`."""
        ...

    def claim_legacy_versions(self, source: str) -> None:
        """Record that the versions written before sources existed are `source`'s (`LEGACY_SOURCE_KEY`)."""
        ...

    def set_properties(self, properties: dict[str, str]) -> None:
        """Set table properties of ours (`properties`), in a commit of their own."""
        ...

    def arrow_schema(self) -> pa.Schema:
        """The table's columns as Arrow."""
        ...

    def check_compatible(
        self, name: str, schema: pa.Schema, partition_by: tuple[str, ...], *, evolvable: tuple[str, ...], spark: bool
    ) -> bool:
        """Refuse (`JobConfigError`, one line naming `name`) a table this export cannot append `schema` to, before
        anything is written; `spark`: the delta-spark engine writes. Return whether it only lacks trailing columns
        of `schema` among `evolvable` (a table made before them: `add_column` evolves it)."""
        ...

    def add_column(self, field: pa.Field) -> None:
        """Schema evolution: add a nullable column (old rows read it as null)."""
        ...

    def delete_rows(self, predicate: str) -> None:
        """Delete the rows matching `predicate` (SQL: `col = 'x' AND col IN (1, 2)`) in one commit (the dead letters
        a replay moved into the export's table)."""
        ...

    def commit(
        self, schema: pa.Schema, files: list[DataFile], versions: dict[str, int], run_id: str, metadata: dict[str, str]
    ) -> int:
        """Commit `files` (of columns `schema`) together with the new recorded versions (`app_id` → last seq) in one
        atomic commit recording `run_id` and `metadata`, against the latest version; return the new version.

        Raises:
            CommitConflict: another writer committed first (nothing of this commit is in the table).
        """
        ...

    def merge_latest(
        self,
        source: pa.Table,
        *,
        keys: tuple[str, ...],
        order: str,
        tombstone: str,
        versions: dict[str, int],
        run_id: str,
        metadata: dict[str, str],
    ) -> dict[str, int]:
        """Merge `source` (one row per `keys`) into the table, with the new recorded versions (`app_id` → last seq), in
        one atomic commit recording `run_id` and `metadata`: a row whose `order` is above its key's row in the table
        replaces that row, or deletes it when its `tombstone` column is set; a new key's row is inserted unless it is
        a tombstone (the `tombstone` column is not written). Return the merge's counts of target rows.

        Raises:
            CommitConflict: another writer committed first (nothing of this commit is in the table).
        """
        ...

    def properties(self) -> dict[str, str]:
        """What the table records of itself: the `configuration` it was created with among them."""
        ...

    def file_stats(self) -> pa.Table:
        """The current version's data files, one row each: `path` (relative to the table, as the table records it:
        maybe URL-quoted), `size_bytes`, each partition column's value (`partition.<column>`) and each column's
        statistics where the file has them (`min.<column>`, `max.<column>`)."""
        ...

    def file_writers(self, paths: set[str], lookback: int) -> dict[str, str]:
        """The commit that added each of `paths` (as `file_stats` gives them), as `table version N, operation, app id
        …, engine …` (app ids other than this library's), reading back at most `lookback` commits from the latest; a
        file not found is left out."""
        ...

    def run_history(self) -> list[RunCommit]:
        """Every commit still readable, with the run id it recorded."""
        ...

    def referenced_files(self) -> set[str]:
        """The data files the current version references, relative to the table (unquoted)."""
        ...

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The latest commits' metadata, newest first (the topic configs a run recorded: `topic_config.py`)."""
        ...

    def to_pyarrow_dataset(self) -> ds.Dataset:
        """The current version's rows."""
        ...

    def check_readable(self) -> None:
        """Refuse (`JobConfigError`) a table whose rows this library's reader would not read as they are."""
        ...

    def compact_files(self, target_bytes: int, *, dry_run: bool) -> UpkeepStep:
        """Rewrite small live files into files of about `target_bytes` (recorded versions unaffected)."""
        ...

    def remove_unreferenced(self, retention_ms: int, *, dry_run: bool) -> UpkeepStep:
        """Delete data files no version within `retention_ms` references."""
        ...


class TableFormat(Protocol):
    """A table format's module (`FORMATS`): how it opens and creates tables."""

    def open(self, location: TableLocation) -> LakeTable | None: ...

    def create(
        self,
        location: TableLocation,
        schema: pa.Schema,
        partition_by: tuple[str, ...],
        configuration: dict[str, str] | None = None,
    ) -> LakeTable: ...

    def check_vacuum_retention(self, table: LakeTable | None, retention_ms: int) -> None: ...


# format name → its implementation's module
FORMATS = {"delta": "tank_log.lakehouse.delta", "iceberg": "tank_log.lakehouse.iceberg"}
# the formats whose data files hold the partition columns too (Delta's leave them to the directory names); here, not
# in the format's module, so the executors writing files need not import the format's library
PARTITION_COLUMNS_IN_FILES = frozenset({"iceberg"})


def implementation(fmt: str) -> TableFormat:
    """The module implementing table format `fmt`.

    Raises:
        JobConfigError: an unknown format.
    """
    import importlib

    if fmt not in FORMATS:
        raise JobConfigError(f"table format {fmt!r}: expected one of {', '.join(sorted(FORMATS))}")
    module: TableFormat = importlib.import_module(FORMATS[fmt])
    return module


def table_mode(table: LakeTable) -> str:
    """The mode the export created `table` with: `append` (also tables made before modes existed) or `latest`."""
    from tank_log.lakehouse.table import MODE_KEY

    return table.properties().get(MODE_KEY) or "append"
