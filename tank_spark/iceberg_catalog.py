"""An Iceberg table of the export as Spark names it: the Spark catalog over the export's Iceberg catalog, and the
table's name there (Iceberg's Spark runtime among the lakehouse jars: `tank_spark.jars`).

    spark_table(location: TableLocation, spark_catalog: str = "tank_log") -> SparkIcebergTable

`location` is the table as the export locates it (`tank_log.lakehouse.location.locate(table, options, "iceberg",
catalog)`, its catalog as `parse_catalog` reads `export.catalog` or `--catalog`). The result's `conf` are the Spark
properties of the Spark catalog `spark_catalog` (`spark.sql.catalog.<name>` = Iceberg's `SparkCatalog`, its table
cache off: pyiceberg's commits must show at the next read): for a REST catalog (`RestCatalog`) `type=rest` with its
`uri`, `warehouse`, `token` or `credential`; for a SQL catalog (the SQLite file beside a local table, or the
SQLAlchemy URI of `export.catalog: {type: sql}`) `type=jdbc`, Iceberg's `JdbcCatalog`, on the same database:
pyiceberg's `SqlCatalog` keeps its tables in the JDBC catalog's schema. Its `name` is the table's Spark name,
`<spark_catalog>.<namespace>.<table>`:

    t = spark_table(locate("/data/events", {}, "iceberg"))
    for key, value in t.conf.items():
        spark.conf.set(key, value)  # before the session first uses the catalog (a used one keeps its settings)
    spark.table(t.name)  # or spark.read.format("iceberg").load(t.name)

The JDBC catalog files a table under its catalog's name, so a SQL catalog's Spark catalog is named as pyiceberg's,
`tank_log` (a session can hold one such catalog; `spark.newSession()` another). A table on object storage gets the
Hadoop settings of its storage options in the catalog's `hadoop.` overrides (s3:// through s3a: hadoop-aws, among
the lakehouse jars); no test reads such a table through Spark yet. Writing through this catalog records no export
watermarks: the export's `--engine spark` writes Iceberg (`tank_spark/export/iceberg_spark.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from tank_log.lakehouse.iceberg import catalog_uri, identifier
from tank_log.lakehouse.location import RestCatalog, TableLocation

SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
SQL_CATALOG_NAME = "tank_log"  # pyiceberg's SqlCatalog name in the export: the JDBC catalog's `catalog_name` rows
SPARK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


@dataclass(frozen=True)
class SparkIcebergTable:
    """A table's Spark name (`catalog.namespace.table`), its Spark catalog's name, and that catalog's Spark
    properties (`spark.sql.catalog.<catalog>…`: they may hold credentials, never shown)."""

    name: str
    catalog: str
    conf: dict[str, str] = field(repr=False)

    def __str__(self) -> str:
        return self.name


def spark_table(location: TableLocation, spark_catalog: str = SQL_CATALOG_NAME) -> SparkIcebergTable:
    """The Spark catalog named `spark_catalog` over `location`'s Iceberg catalog, and the table's Spark name there.

    Raises:
        ValueError: not an Iceberg table, a Spark catalog name SQL does not take (or not `tank_log` for a SQL
            catalog), or a SQL catalog whose database Iceberg's JDBC catalog cannot open (sqlite and postgresql).
    """
    if location.format != "iceberg":
        raise ValueError(f"table {location}: format {location.format}, not iceberg (a Spark catalog serves Iceberg)")
    if not SPARK_NAME.fullmatch(spark_catalog):
        raise ValueError(f"Spark catalog name {spark_catalog!r}: expected letters, digits and '_'")
    prefix = f"spark.sql.catalog.{spark_catalog}"
    conf = {prefix: SPARK_CATALOG, f"{prefix}.cache-enabled": "false"}  # pyiceberg commits behind Spark's back
    catalog = location.catalog
    if isinstance(catalog, RestCatalog):
        conf[f"{prefix}.type"] = "rest"
        conf[f"{prefix}.uri"] = catalog.uri
        for key in ("warehouse", "token", "credential"):
            value = getattr(catalog, key)
            if value:
                conf[f"{prefix}.{key}"] = value
    else:
        if spark_catalog != SQL_CATALOG_NAME:
            raise ValueError(
                f"Spark catalog name {spark_catalog!r}: a SQL catalog's Spark catalog is named {SQL_CATALOG_NAME} "
                "(Iceberg's JDBC catalog finds the export's tables under the name pyiceberg filed them with)"
            )
        conf[f"{prefix}.type"] = "jdbc"
        conf.update({f"{prefix}.{k}": v for k, v in jdbc_properties(catalog_uri(location)).items()})
        conf[f"{prefix}.warehouse"] = location.uri if "://" in location.uri else f"file://{location.uri}"
    for key, value in location.spark_options().items():  # s3a's endpoint and credentials, for this catalog only
        conf[f"{prefix}.hadoop.{key}"] = value
    if urlparse(location.uri).scheme == "s3":
        conf[f"{prefix}.hadoop.fs.s3.impl"] = S3A  # Iceberg records s3:// paths; Hadoop reads them through s3a
    return SparkIcebergTable(".".join((spark_catalog, *identifier(location))), spark_catalog, conf)


def jdbc_properties(sqlalchemy_uri: str) -> dict[str, str]:
    """Iceberg JDBC catalog properties (`uri`, `jdbc.user`, `jdbc.password`) of a SQL catalog's SQLAlchemy URI:
    `sqlite:////abs/catalog.db` → `jdbc:sqlite:/abs/catalog.db`; `postgresql[+driver]://user:pw@host:port/db` →
    `jdbc:postgresql://host:port/db` (PostgreSQL's JDBC driver is not among the lakehouse jars: add it).

    Raises:
        ValueError: another database, or a SQLite catalog in memory or at a relative path.
    """
    parsed = urlparse(sqlalchemy_uri)
    dialect = parsed.scheme.partition("+")[0]
    if dialect == "sqlite":
        path = sqlalchemy_uri.partition(":///")[2].partition("?")[0]
        if not path.startswith("/"):
            raise ValueError(
                f"catalog {sqlalchemy_uri}: Spark opens a SQLite catalog by its absolute path (sqlite:////abs/path)"
            )
        return {"uri": f"jdbc:sqlite:{path}"}
    if dialect in ("postgresql", "postgres"):
        host = parsed.hostname or "localhost"
        port = f":{parsed.port}" if parsed.port else ""
        out = {"uri": f"jdbc:postgresql://{host}{port}{parsed.path}"}
        if parsed.username:
            out["jdbc.user"] = unquote(parsed.username)
        if parsed.password:
            out["jdbc.password"] = unquote(parsed.password)
        return out
    shown = f"{parsed.scheme}://{parsed.hostname or ''}{parsed.path}"  # never the password
    raise ValueError(f"catalog {shown}: Spark's Iceberg JDBC catalog here opens sqlite and postgresql databases")
