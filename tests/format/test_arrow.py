"""tank_log/format/arrow.py: pyarrow's pandas detection skipped, pandas conversions intact (each in a fresh process)."""

import subprocess
import sys

from conftest import data_dir


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_arrow_conversions_no_longer_import_pandas_and_pandas_conversions_still_work():
    out = run(
        """
import sys
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from tank_log.format.arrow import skip_pandas_detection
assert skip_pandas_detection()
pa.array(["x"], pa.string()); pa.scalar(3); pc.greater(pa.array(np.arange(3)), 1); pa.array(np.zeros(2))
print("pandas" in sys.modules)
frame = pa.table({"a": [1, None]}).to_pandas()
import pandas as pd
print(list(frame["a"].isna()), pa.array(pd.Series([1.5, None])).null_count, pa.array(pd.Categorical(["a"])).type)
"""
    )
    assert out.split("\n")[:2] == ["False", "[False, True] 1 dictionary<values=string, indices=int8, ordered=0>"]


def test_the_executors_reader_does_not_import_pandas_and_a_process_with_pandas_is_left_alone():
    out = run(
        f"""
import sys
from tank_spark.ranges import Bounds, plan_ranges, read_range
ranges = plan_ranges([{data_dir("C_misc")!r}], Bounds(), True, 1 << 20)
rows = sum(b.num_rows for r in ranges for b in read_range(r))
print(rows > 100, "pandas" in sys.modules)
"""
    )
    assert out.split() == ["True", "False"]  # without the skip: True True (pa.array of the topic name)
    assert (
        run("import pandas\nfrom tank_log.format.arrow import skip_pandas_detection\nprint(skip_pandas_detection())")[
            :5
        ]
        == "False"
    )
