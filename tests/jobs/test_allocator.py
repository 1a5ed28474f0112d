"""A maintenance process keeps its freed chunk buffers (jobs/allocator.py): decoding chunk after chunk no longer
faults fresh pages in for every chunk. Measured in real processes, by the kernel's count of minor page faults."""

import os
import random
import subprocess
import sys

import pytest

from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.writer import BundlePolicy

DECODE_THRICE = """
import resource, sys
from tank_log.jobs.planning import PartitionTask
from tank_log.storage.datadir import scan_partition

class Nothing(PartitionTask):
    def apply(self, part):
        return {}

if sys.argv[2] == "task":  # a job's partition task sets the allocator up, whatever it does
    Nothing("", "t", 0, sys.argv[1]).run()
part = scan_partition(sys.argv[1], "t", 0)
for _ in range(3):  # the last pass: by then the heap has what a chunk needs
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for seg in part.ro:
        for chunk in seg.chunks():
            chunk.cols
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_partition_task_makes_chunked_decoding_reuse_its_buffers(tmp_path):
    rng = random.Random(7)
    d = str(tmp_path / "t" / "0")
    values = [rng.randbytes(60) * 2 for _ in range(64)]  # Snappy halves them: chunks decompress to ~2 MiB
    msgs = (Message(i + 1, 1_700_000_000_000 + i, b"k%d" % (i % 5000), values[i % 64]) for i in range(150_000))
    policy = BundlePolicy(max_messages=100, max_bytes=1 << 20, snappy=SnappyPolicy.ALWAYS)
    write_partition(d, msgs, segment_bytes=4 << 20, with_active=False, policy=policy)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def faults(how: str) -> int:
        out = subprocess.run([sys.executable, "-c", DECODE_THRICE, d, how], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    plain, tuned = faults("library"), faults("task")
    assert plain > 1000 and tuned * 10 < plain, (plain, tuned)
