"""Export benchmark: >= 1M messages through jobs/export_delta.py on local[2] (with its default settings,
forced onto Spark's executors with --in-driver-max-bytes 0, through delta-spark with --engine spark, into an Iceberg
table with --format iceberg, and into a current-state table with --mode latest), beside writing the same rows from a
Parquet copy into Delta with the same engine (deltalake's write_deltalake); then the way back: the table through
jobs/import_delta.py into an empty base path, beside the library's writer (write_partition) writing the same rows in
process.

Typed values: the same messages as Avro and as Protobuf values, each exported into a typed table beside the binary
export, with the decoding's share of each export's time.

Iceberg as its users run it: the same messages exported into tables named in a REST catalog (Iceberg's reference
server, scripts/iceberg-rest-catalog.sh, on a loopback port), by pyiceberg in the driver and by `--engine spark`
(Spark's Iceberg writer stages, pyiceberg commits), each beside the Delta export of the same run by the same engine,
with the load average before each export.

Run: python bench/export.py [--messages 1000000] [--partitions 2] [--workdir DIR]
     python bench/export.py --s3    (both tables on a loopback S3 server, moto; the export only)
     python bench/export.py --only iceberg [--rounds 3]    (the Delta and Iceberg exports by both engines only)
     python bench/export.py --only typed [--rounds 3]    (the binary export and the typed ones beside it only)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from common import BUNDLE, bundle_messages, machine, run_job  # noqa: E402

from tank_log.format.arrow import columns_from_arrow  # noqa: E402
from tank_log.format.bundle import Message, SnappyPolicy  # noqa: E402
from tank_log.storage.partition_writer import PartitionWriter, write_partition  # noqa: E402
from tank_log.storage.writer import BundlePolicy  # noqa: E402


def generate(base: str, messages: int, partitions: int, encode: Callable[[bytes], bytes] | None = None) -> None:
    """The benchmark's messages; `encode`: their values re-encoded (the typed exports' Avro, Protobuf)."""
    per = messages // partitions
    bundles = per // BUNDLE
    for p in range(partitions):

        def msgs(p=p):
            for b in range(bundles):
                for j, (ts, key, value) in enumerate(bundle_messages(p * bundles + b)):
                    yield Message(b * BUNDLE + j + 1, ts, key, encode(value) if encode else value)

        write_partition(
            os.path.join(base, "bench", str(p)),
            msgs(),
            segment_bytes=64 << 20,
            policy=BundlePolicy(max_messages=BUNDLE, max_bytes=1 << 30, snappy=SnappyPolicy.CLIENT),
        )


def free_port() -> int:
    """A free TCP port on loopback (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def s3_server():
    """Start moto's S3 server on a free loopback port with a bucket: (process, storage options, job flags)."""
    import boto3

    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
    os.environ.update(creds)  # the job's environment too
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    options = {**creds, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    flags = [f"--storage-option=AWS_ENDPOINT_URL={endpoint}", "--storage-option=AWS_ALLOW_HTTP=true"]
    return proc, options, flags


def _ms(batch):
    """The producer's ms (uint64) from a row batch's µs timestamps."""
    import numpy as np
    import pyarrow as pa

    return np.floor_divide(batch.column("ts").cast(pa.int64()).to_numpy(), 1000).astype(np.uint64)


def warm_up(table: str, options: dict[str, str]) -> None:
    """Write ~30 MB to the S3 server through delta-rs and through pyarrow (as the export does): its first uploads are
    slower (its handlers load), and neither side should pay for that in the timed runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from tank_spark.export.location import TableLocation

    rows = pa.table({"seq": pa.array(np.arange(300_000)), "value": pa.array([b"v" * 100] * 300_000)})
    write_deltalake(table, rows, storage_options=options)
    filesystem, root = TableLocation.of(table, options).filesystem()
    pq.write_table(rows, f"{root}/warm-up.parquet", filesystem=filesystem)


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for r, _, fs in os.walk(root):
        for f in fs:
            with open(os.path.join(r, f), "rb") as fh:
                out[os.path.relpath(os.path.join(r, f), root)] = fh.read()
    return out


def parquet_to_delta_s(rows, work: str) -> float:
    """Seconds to write the same rows from a Parquet copy into Delta with the export's engine (the reference)."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    copy = os.path.join(work, "copy.parquet")
    pq.write_table(rows, copy)
    other = os.path.join(work, "table-from-parquet")
    shutil.rmtree(other, ignore_errors=True)
    t1 = time.perf_counter()
    write_deltalake(other, pq.read_table(copy), partition_by=["topic", "date"])
    return time.perf_counter() - t1


def library_writer_s(rows, work: str, partitions: int) -> dict[str, float]:
    """Seconds of the library's writer on the same rows, one Message each ("messages") or from Arrow ("columns");
    both must write the same files."""
    import pyarrow as pa
    import pyarrow.compute as pc

    library_writer = {}
    for how in ("messages", "columns"):  # the library's writer on the same rows: one Message each, or from Arrow
        written = os.path.join(work, f"written-{how}")
        shutil.rmtree(written, ignore_errors=True)
        t3 = time.perf_counter()
        for p in range(partitions):
            part = rows.filter(pc.equal(rows["partition"], p)).sort_by("seq")
            directory = os.path.join(written, "bench", str(p))
            if how == "columns":
                w = PartitionWriter(directory, segment_bytes=64 << 20)
                for chunk in part.to_batches(max_chunksize=64 * 1024):
                    seq = chunk.column("seq").to_numpy().view(np.uint64)
                    w.add_columns(columns_from_arrow(seq, _ms(chunk), chunk.column("key"), chunk.column("value")))
                w.finish()
                continue
            cols = part.select(["seq", "key", "value"]).to_pydict()
            ts_ms = pc.divide(part["ts"].cast(pa.int64()), 1000)  # µs → the producer's ms
            write_partition(
                directory,
                (
                    Message(seq, ts, key, value)
                    for seq, ts, key, value in zip(
                        cols["seq"], ts_ms.to_pylist(), cols["key"], cols["value"], strict=True
                    )
                ),
                segment_bytes=64 << 20,
            )
        library_writer[how] = time.perf_counter() - t3
    assert _files(os.path.join(work, "written-messages")) == _files(os.path.join(work, "written-columns"))
    return library_writer


def import_back(table: str, work: str) -> tuple[float, dict]:
    """The way back: Delta → TANK through the import job; its process's wall seconds and its report's summary."""
    imported, import_report = os.path.join(work, "imported"), os.path.join(work, "import.json")
    shutil.rmtree(imported, ignore_errors=True)
    os.makedirs(imported)
    wall, rep = run_job("import_delta", "--data-dir", imported, "--table", table, report=import_report)
    return wall, rep["summary"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--s3", action="store_true", help="export to a loopback S3 server (moto) instead of a local path")
    ap.add_argument(
        "--only",
        choices=["iceberg", "typed"],
        help="iceberg: only the Delta exports by both engines and the Iceberg ones (at a path; by name in a REST "
        "catalog, by both engines); typed: only the binary export and the Avro and Protobuf ones beside it",
    )
    ap.add_argument("--rounds", type=int, default=1, help="with --only: rounds on the same messages (default 1)")
    args = ap.parse_args()
    if args.rounds < 1 or (args.rounds > 1 and not args.only):
        ap.error("--rounds: at least 1, and more only with --only")
    if args.s3:
        export_to_s3(args)
        return
    if args.only == "typed":
        only_typed(args)
        return
    if args.only:
        only_iceberg(args)
        return
    work = args.workdir or tempfile.mkdtemp(prefix="tank-export-")
    base, table, report = (os.path.join(work, n) for n in ("data", "table", "report.json"))
    for p in (base, table):
        shutil.rmtree(p, ignore_errors=True)
    generate(base, args.messages, args.partitions)
    data_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(base) for f in fs)

    load_before_delta = uptime()
    wall, rep = run_job("export_delta", "--data-dir", base, "--table", table, report=report)  # default settings
    s = rep["summary"]
    executors_wall, e = export_on_executors(base, os.path.join(work, "table-on-executors"), s["rows"])
    spark_table = os.path.join(work, "table-delta-spark")
    load_before_delta_spark = uptime()
    spark_wall, sp = export_on_executors(base, spark_table, s["rows"], ["--engine", "spark"])

    load_before_iceberg = uptime()
    iceberg_wall, ice = export_in_driver(base, os.path.join(work, "table-iceberg"), ["--format", "iceberg"])
    with rest_catalog(os.path.join(work, "rest-catalog")) as uri:  # the same messages by name, by both engines
        measured = {"delta": (wall, s), "iceberg_sqlite": (iceberg_wall, ice), "delta_spark": (spark_wall, sp)}
        by_name = iceberg_beside_delta(base, work, uri, "full", s["rows"], measured)
    by_name["load_before"] |= {
        "delta": load_before_delta,
        "delta_spark": load_before_delta_spark,
        "iceberg_sqlite": load_before_iceberg,
    }
    latest_wall, lat = export_in_driver(base, os.path.join(work, "table-latest"), ["--mode", "latest"])

    from deltalake import DeltaTable

    rows = DeltaTable(table).to_pyarrow_table()
    parquet_to_delta = parquet_to_delta_s(rows, work)

    import_wall, imp = import_back(table, work)  # beside the library's writer on the same rows
    library_writer = library_writer_s(rows, work, args.partitions)

    typed = typed_exports(work, args.messages, args.partitions, s)
    out = {
        "machine": machine(),
        "messages": s["rows"],
        "partitions": args.partitions,
        "tank_bytes_on_disk": data_bytes,
        "delta_bytes": s["bytes"],
        "files": s["files"],
        "export_executed_on": s["executed_on"],
        "export_process_wall_s": round(wall, 2),
        "export_job_s": s["export_s"],
        "rows_per_s_job": round(s["rows"] / s["export_s"]),
        "mb_per_s_job": round(data_bytes / s["export_s"] / 1e6, 1),
        "parquet_to_delta_s": round(parquet_to_delta, 2),
        "ratio_job_vs_parquet_to_delta": round(s["export_s"] / parquet_to_delta, 2),
        "executors_process_wall_s": round(executors_wall, 2),
        "executors_export_s": e["export_s"],
        "ratio_executors_vs_parquet_to_delta": round(e["export_s"] / parquet_to_delta, 2),
        "delta_spark_process_wall_s": round(spark_wall, 2),
        "delta_spark_export_s": sp["export_s"],
        "ratio_delta_spark_vs_parquet_to_delta": round(sp["export_s"] / parquet_to_delta, 2),
        "ratio_delta_spark_vs_executors": round(sp["export_s"] / e["export_s"], 2),
        "iceberg_process_wall_s": round(iceberg_wall, 2),
        "iceberg_export_s": ice["export_s"],
        "ratio_iceberg_vs_delta_job": round(ice["export_s"] / s["export_s"], 2),
        "ratio_iceberg_vs_parquet_to_delta": round(ice["export_s"] / parquet_to_delta, 2),
        "latest_process_wall_s": round(latest_wall, 2),
        "latest_export_s": lat["export_s"],
        "latest_keys": lat["keys"],
        "ratio_latest_vs_delta_job": round(lat["export_s"] / s["export_s"], 2),
        "ratio_latest_vs_parquet_to_delta": round(lat["export_s"] / parquet_to_delta, 2),
        "import_process_wall_s": round(import_wall, 2),
        "import_job_s": imp["import_s"],
        "rows_per_s_import_job": imp["rows_per_s"],
        "library_writer_messages_s": round(library_writer["messages"], 2),
        "library_writer_columns_s": round(library_writer["columns"], 2),
        "ratio_import_job_vs_library_writer_columns": round(imp["import_s"] / library_writer["columns"], 2),
        "iceberg_beside_delta": by_name,
        **typed,
    }
    print(json.dumps(out, indent=2))


# ---- typed values: the same messages as Avro and Protobuf values (docs/guides/typed-tables.md) ----------------------

ROW_FIELDS = (("id", "long", "int64"), ("i", "long", "int64"), ("name", "string", "string"),
              ("amount", "double", "double"), ("flags", "string", "string"), ("note", "string", "string"))  # fmt: skip
VALUE = re.compile(rb'\{"id":(\d+),"i":(\d+),"name":"([^"]*)","amount":([0-9.]+),"flags":"([^"]*)","note":"(.*)')


def _record(value: bytes) -> dict:
    """The fields of a benchmark value (BENCH.md's JSON, cut at 100 bytes: its note is what is left)."""
    m = VALUE.match(value)
    assert m is not None, value
    ident, i, name, amount, flags, note = m.groups()
    return {"id": int(ident), "i": int(i), "name": name.decode(), "amount": float(amount), "flags": flags.decode(),
            "note": note.decode()}  # fmt: skip


def _schemas(work: str) -> tuple[str, str]:
    """The rows' Avro schema (.avsc) and Protobuf schema (.proto, message bench.Row), written under `work`."""
    avsc, proto = os.path.join(work, "row.avsc"), os.path.join(work, "row.proto")
    with open(avsc, "w") as fh:
        json.dump({"type": "record", "name": "Row", "fields": [{"name": n, "type": t} for n, t, _ in ROW_FIELDS]}, fh)
    with open(proto, "w") as fh:
        body = "".join(f"  {pt} {n} = {k};\n" for k, (n, _, pt) in enumerate(ROW_FIELDS, 1))
        fh.write(f'syntax = "proto3";\npackage bench;\nmessage Row {{\n{body}}}\n')
    return avsc, proto


def decode_s(decoder, values: list[bytes], rows: int) -> float:
    """Seconds to decode `values` in batches of a read batch's rows, scaled to `rows`."""
    import pyarrow as pa

    decoder.decode(pa.array(values[:1000], pa.binary()))  # warm: first-call costs (pyarrow imports pandas)
    t0 = time.perf_counter()
    for k in range(0, len(values), 8192):  # about the rows of a read batch
        decoder.decode(pa.array(values[k : k + 8192], pa.binary()))
    return (time.perf_counter() - t0) * rows / len(values)


def typed_exports(work: str, messages: int, partitions: int, binary: dict, reuse: bool = False) -> dict:
    """The benchmark's messages as Avro and as Protobuf values, each exported in the driver (the default settings)
    into a typed table, beside the binary export (`binary`: its summary); and the decoding's share of each export:
    the same values decoded in this process, in the export's batch size, over the export's time (for Protobuf also
    on protobuf's parser, `protobuf_upb_decode_s`: the decoding the compiled path replaced); the load before each.
    `reuse`: the typed messages a previous round generated under `work`."""
    import io

    import fastavro

    from tank_log.format import native
    from tank_log.values import ValueSpec, decoder_for

    avsc, proto = _schemas(work)
    avro_schema = fastavro.parse_schema(json.load(open(avsc)))

    def avro(value: bytes) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, avro_schema, _record(value))
        return out.getvalue()

    pb_spec = ValueSpec("protobuf", schema_file=proto, message="bench.Row")
    row_cls = getattr(decoder_for(pb_spec), "_cls")  # noqa: B009 - the compiled message class

    def protobuf(value: bytes) -> bytes:
        return row_cls(**_record(value)).SerializeToString()

    out: dict = {}
    for name, encode, spec, flags in (
        ("avro", avro, ValueSpec("avro", schema_file=avsc), ["--value-schema-file", avsc]),
        ("protobuf", protobuf, pb_spec, ["--value-schema-file", proto, "--value-message", "bench.Row"]),
    ):
        base = os.path.join(work, f"data-{name}")
        if not (reuse and os.path.isdir(base)):
            shutil.rmtree(base, ignore_errors=True)
            generate(base, messages, partitions, encode)
        out[f"load_before_{name}"] = uptime()
        wall, rep = export_in_driver(base, os.path.join(work, f"table-{name}"), ["--value-format", name, *flags])
        assert rep["rows"] == binary["rows"] and not rep.get("dead_lettered"), rep
        values = [encode(v) for b in range(min(messages, 200_000) // BUNDLE) for _, _, v in bundle_messages(b)]

        decoded = decode_s(decoder_for(spec), values, rep["rows"])
        if name == "protobuf":
            with native.use_pure():
                upb = decoder_for(spec)
            out["protobuf_compiled_path"] = getattr(decoder_for(spec), "fast", False)
            out["protobuf_upb_decode_s"] = round(decode_s(upb, values, rep["rows"]), 2)
        out |= {
            f"{name}_process_wall_s": round(wall, 2),
            f"{name}_export_s": rep["export_s"],
            f"{name}_rows_per_s": round(rep["rows"] / rep["export_s"]),
            f"ratio_{name}_vs_binary_export": round(rep["export_s"] / binary["export_s"], 2),
            f"{name}_decode_s": round(decoded, 2),
            f"{name}_decode_share_of_export": round(decoded / rep["export_s"], 2),
        }
    return out


# ---- Iceberg as its users run it: tables by name in a REST catalog, and the Spark engine ---------------------------

REST_SCRIPT = os.path.join(ROOT, "scripts", "iceberg-rest-catalog.sh")


def uptime() -> list[float]:
    """The load averages over 1, 5 and 15 minutes, as `uptime` prints them."""
    return [round(x, 2) for x in os.getloadavg()]


@contextlib.contextmanager
def rest_catalog(state: str) -> Iterator[str]:
    """Iceberg's reference REST catalog server (scripts/iceberg-rest-catalog.sh) on a free loopback port, its state in
    `state` (emptied first); yields its URI and stops it on the way out, whatever happened (SIGTERM included)."""
    shutil.rmtree(state, ignore_errors=True)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally` below on a kill too
    try:
        port = free_port()
        r = subprocess.run(["bash", REST_SCRIPT, "start", str(port), state], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"the REST catalog did not start ({r.returncode}): {(r.stdout + r.stderr).strip()}")
        yield f"http://127.0.0.1:{port}"
    finally:
        r = subprocess.run(["bash", REST_SCRIPT, "stop", state], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"the REST catalog in {state} did not stop: {(r.stdout + r.stderr).strip()}", file=sys.stderr)
        signal.signal(signal.SIGTERM, previous)


def export_by_name(base: str, name: str, uri: str, rows: int, flags: list[str]) -> tuple[float, dict]:
    """The export into the new Iceberg table `name` of the REST catalog at `uri`, with `flags`; the catalog must then
    hold every message in it (its snapshot's record count, read through the catalog)."""
    from pyiceberg.catalog import load_catalog

    report = os.path.join(os.path.dirname(base), f"report-{name}.json")
    wall, rep = run_job(
        "export_delta", "--data-dir", base, "--table", name, "--format", "iceberg", "--catalog", uri, *flags,
        report=report,
    )  # fmt: skip
    summary = rep["summary"]
    snapshot = load_catalog("bench", type="rest", uri=uri).load_table(name).current_snapshot()
    assert summary["rows"] == rows and snapshot is not None, summary
    assert int(snapshot.summary["total-records"]) == rows, snapshot.summary
    return wall, summary


def iceberg_beside_delta(
    base: str, work: str, uri: str, tag: str, rows: int, measured: dict[str, tuple[float, dict]] | None = None
) -> dict:
    """One round: the same messages exported by each engine into Delta and into Iceberg, each case into a new table,
    in this order (each Iceberg case just after the Delta one of its engine):

    - delta: into a Delta table by the deltalake engine, default settings (in the driver at the bench's sizes);
    - iceberg_sqlite: into an Iceberg table at a path, its SQLite catalog beside it (pyiceberg, default settings);
    - iceberg_rest: into `bench.<tag>_pyiceberg` of the REST catalog (pyiceberg, default settings);
    - delta_spark: into a Delta table by `--engine spark` (delta-spark, on Spark's executors);
    - iceberg_spark: into `bench.<tag>_spark` of the REST catalog by `--engine spark` (Spark's Iceberg writer stages
      the files on the executors, pyiceberg commits them).

    `measured`: cases this run has timed already (the full run's), not run again. Each case's `export_s` (the
    job's report) and process wall seconds, the load averages before it, and the ratios of each Iceberg case to the
    Delta export of the same engine in this round (the pyiceberg cases to `delta`, the Spark one to `delta_spark`)."""
    cases: dict[str, Callable[[], tuple[float, dict]]] = {
        "delta": lambda: export_in_driver(base, os.path.join(work, "table"), []),
        "iceberg_sqlite": lambda: export_in_driver(base, os.path.join(work, "table-iceberg"), ["--format", "iceberg"]),
        "iceberg_rest": lambda: export_by_name(base, f"bench.{tag}_pyiceberg", uri, rows, []),
        "delta_spark": lambda: export_on_executors(
            base, os.path.join(work, "table-delta-spark"), rows, ["--engine", "spark"]
        ),
        "iceberg_spark": lambda: export_by_name(
            base, f"bench.{tag}_spark", uri, rows, ["--engine", "spark", "--in-driver-max-bytes", "0"]
        ),
    }
    results = dict(measured or {})
    load: dict[str, list[float]] = {}
    for case, run in cases.items():
        if case not in results:
            load[case] = uptime()
            results[case] = run()
    out: dict = {"load_before": load}
    for case, (wall, summary) in results.items():
        assert summary["rows"] == rows, (case, summary)
        out |= {f"{case}_export_s": summary["export_s"], f"{case}_process_wall_s": round(wall, 2)}
    out["engines"] = {case: summary["engine"] for case, (_, summary) in results.items()}
    out["executed_on"] = {case: summary["executed_on"] for case, (_, summary) in results.items()}
    for case, reference in (("iceberg_sqlite", "delta"), ("iceberg_rest", "delta"), ("iceberg_spark", "delta_spark")):
        for figure in ("export_s", "process_wall_s"):
            out[f"ratio_{case}_vs_{reference}_{figure}"] = round(
                out[f"{case}_{figure}"] / out[f"{reference}_{figure}"], 2
            )
    out["ratio_iceberg_spark_vs_iceberg_rest_export_s"] = round(
        out["iceberg_spark_export_s"] / out["iceberg_rest_export_s"], 2
    )
    return out


def ranges(rounds: list[dict]) -> dict[str, list[float]]:
    """Each number of the rounds (loads excluded): [lowest, highest]."""
    keys = [k for k, v in rounds[0].items() if isinstance(v, int | float)]
    return {k: [min(r[k] for r in rounds), max(r[k] for r in rounds)] for k in keys}


def only_typed(args: argparse.Namespace) -> None:
    """`--only typed`: `--rounds` rounds of the binary export (the default settings, in the driver) and the typed
    exports beside it (`typed_exports`), on the same messages, with the load before each export."""
    work = args.workdir or tempfile.mkdtemp(prefix="tank-export-typed-")
    base = os.path.join(work, "data")
    for name in ("data", "data-avro", "data-protobuf"):
        shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    generate(base, args.messages, args.partitions)
    rounds = []
    for n in range(1, args.rounds + 1):
        load = uptime()
        wall, binary = export_in_driver(base, os.path.join(work, "table-binary"), [])
        typed = typed_exports(work, args.messages, args.partitions, binary, reuse=n > 1)
        rounds.append({"load_before_binary": load, "binary_export_s": binary["export_s"], **typed})
        print(json.dumps({"round": n, **rounds[-1]}), file=sys.stderr, flush=True)
    out = {"machine": machine(), "messages": binary["rows"], "partitions": args.partitions, "rounds": rounds}
    print(json.dumps({**out, "ranges": ranges(rounds)}, indent=2))


def only_iceberg(args: argparse.Namespace) -> None:
    """`--only iceberg`: the messages once, the REST catalog started once, then `--rounds` rounds of
    `iceberg_beside_delta`, each into new tables."""
    work = args.workdir or tempfile.mkdtemp(prefix="tank-export-iceberg-")
    base = os.path.join(work, "data")
    shutil.rmtree(base, ignore_errors=True)
    generate(base, args.messages, args.partitions)
    rows = args.messages // args.partitions // BUNDLE * BUNDLE * args.partitions
    data_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(base) for f in fs)
    rounds = []
    with rest_catalog(os.path.join(work, "rest-catalog")) as uri:
        for n in range(1, args.rounds + 1):
            rounds.append(iceberg_beside_delta(base, work, uri, f"r{n}", rows))
            print(json.dumps({"round": n, **rounds[-1]}), file=sys.stderr, flush=True)
    out = {
        "machine": machine(),
        "messages": rows,
        "partitions": args.partitions,
        "tank_bytes_on_disk": data_bytes,
        "rounds": rounds,
        "ranges": ranges(rounds),
    }
    print(json.dumps(out, indent=2))


def export_to_s3(args) -> None:
    """The export job into s3://bench/table, beside write_deltalake of the same rows into s3://bench/from-parquet."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    work = args.workdir or tempfile.mkdtemp(prefix="tank-export-s3-")
    base, report = os.path.join(work, "data"), os.path.join(work, "report.json")
    shutil.rmtree(base, ignore_errors=True)
    generate(base, args.messages, args.partitions)
    proc, options, flags = s3_server()
    try:
        warm_up("s3://bench/warm-up", options)
        wall, rep = run_job("export_delta", "--data-dir", base, "--table", "s3://bench/table", *flags, report=report)
        s = rep["summary"]
        executors_wall, e = export_on_executors(base, "s3://bench/table-on-executors", s["rows"], flags)
        copy = os.path.join(work, "copy.parquet")
        pq.write_table(DeltaTable("s3://bench/table", storage_options=options).to_pyarrow_table(), copy)
        rows = pq.read_table(copy)
        t1 = time.perf_counter()
        write_deltalake("s3://bench/from-parquet", rows, partition_by=["topic", "date"], storage_options=options)
        parquet_to_delta = time.perf_counter() - t1
    finally:
        proc.kill()
        proc.wait()
    out = {
        "machine": machine(),
        "messages": s["rows"],
        "export_executed_on": s["executed_on"],
        "export_process_wall_s": round(wall, 2),
        "export_job_s": s["export_s"],
        "rows_per_s_job": round(s["rows"] / s["export_s"]),
        "parquet_to_delta_s3_s": round(parquet_to_delta, 2),
        "ratio_job_vs_parquet_to_delta": round(s["export_s"] / parquet_to_delta, 2),
        "executors_process_wall_s": round(executors_wall, 2),
        "executors_export_s": e["export_s"],
        "ratio_executors_vs_parquet_to_delta": round(e["export_s"] / parquet_to_delta, 2),
    }
    print(json.dumps(out, indent=2))


def export_in_driver(base: str, table: str, flags: list[str]) -> tuple[float, dict]:
    """The export with the default settings and `flags` (another table format, another mode) into a new table."""
    report = os.path.join(os.path.dirname(base), "report-" + os.path.basename(table) + ".json")
    shutil.rmtree(table, ignore_errors=True)
    catalog = table.rstrip("/") + ".iceberg-catalog.db"  # the default catalog of a local Iceberg table
    if os.path.exists(catalog):
        os.remove(catalog)
    wall, rep = run_job("export_delta", "--data-dir", base, "--table", table, *flags, report=report)
    return wall, rep["summary"]


def export_on_executors(
    base: str, table: str, rows: int, flags: tuple[str, ...] | list[str] = ()
) -> tuple[float, dict]:
    """The same export with `--in-driver-max-bytes 0`: Spark's executors read and write, whatever the size."""
    report = os.path.join(os.path.dirname(base), "report-on-executors.json")
    if "://" not in table:
        shutil.rmtree(table, ignore_errors=True)
    wall, rep = run_job(
        "export_delta", "--data-dir", base, "--table", table, *flags, "--in-driver-max-bytes", "0", report=report
    )
    summary = rep["summary"]
    assert summary["executed_on"] == "executors" and summary["rows"] == rows, summary
    return wall, summary


if __name__ == "__main__":
    main()
