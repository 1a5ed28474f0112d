#!/usr/bin/env bash
# Build dist/tank_log.zip: the tank_log and tank_spark packages for spark-submit --py-files (the executors also need
# numpy, pyarrow, python-snappy/cramjam and deltalake installed: pip install -r <(python -c ...) or pip install .).
# Python cannot import a compiled module from a zip, so code shipped this way runs on the pure-Python codec core;
# executors where tank-log itself is pip-installed (a wheel) get the compiled one.
#   bash scripts/package.sh            → prints the path of the zip
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist
rm -f dist/tank_log.zip
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PY" - <<'PYEOF'
import os
import zipfile

with zipfile.ZipFile("dist/tank_log.zip", "w", zipfile.ZIP_DEFLATED) as zf:
    for package in ("tank_log", "tank_spark"):
        for root, dirs, files in os.walk(package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in sorted(files):
                if f.endswith(".py"):
                    zf.write(os.path.join(root, f))
PYEOF
echo "$(pwd)/dist/tank_log.zip"
