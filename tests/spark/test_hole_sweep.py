"""The hole sweep's Spark part (bench/hole_sweep.py), small and deterministic: the first RO segment of four fixture
partitions (plain, dense index, sparse, compacted) truncated at and in its first bundle, that bundle cut out or
duplicated, a directory and a FIFO in its place, and each partition undamaged (no false alarm); through the export
on Spark's executors (prefix and skip) and in the driver, and the `tank` data source (whole segments and split at
every index entry). No silent loss, no recorded version past a hole."""

import os
from concurrent.futures import ThreadPoolExecutor

from conftest import load_script


def test_hole_sweep_export_and_source(spark, tmp_path):
    """The sweep's steps as `run_sweep` takes them, but the three export jobs (processes of their own, reading the
    damaged partitions only) run one after the other while the data source reads the same partitions on the shared
    session: each step records its own runs, so the figures are those of the sweep run step by step."""
    sweep_mod = load_script(os.path.join("bench", "hole_sweep.py"))
    cases = sweep_mod.damages(max_per_segment=1, max_segments=1)
    exports = [("executors", "prefix"), ("executors", "skip"), ("driver", "prefix")]
    sweep = sweep_mod.Sweep()
    base = str(tmp_path / "base")
    os.makedirs(base)
    wants = sweep_mod.sweep_library(cases, base, sweep)

    def export_all() -> None:
        for where, mode in exports:
            sweep_mod.sweep_export(cases, base, wants, sweep, where=where, mode=mode, work=str(tmp_path))

    with ThreadPoolExecutor(1) as pool:
        exported = pool.submit(export_all)
        sweep_mod.sweep_source(cases, base, wants, sweep, spark)
        exported.result()  # an export that failed to run raises here
    figures = sweep.figures()
    assert sweep.failures() == []
    assert len(cases) == 28  # with an undamaged control per partition
    for reader in ("export-executors-prefix", "export-executors-skip", "export-driver-prefix", "source-whole"):
        f = figures[reader]
        assert f["runs"] == len(cases) and f["losses"] == len(cases) - 4
        assert f["silent"] == 0 and f["records_past_hole"] == 0 and f["false_alarms"] == 0
    assert figures["source-split"]["silent"] == figures["source-split"]["false_alarms"] == 0
