#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install tank-log with its dev and airflow extras, compiling its codec core
# (Cython + gcc). Idempotent: reinstalls only when pyproject.toml, setup.py or the compiled core's source changed
# since the last successful install, or when the compiled core is missing.
#
# Each step says what it does before it starts (on stdout, prefixed "setup:"); a first run takes 10-20 minutes, most
# of it pip and Maven downloading. What goes where, and what needs root: README.md, "Requirements".
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "setup: $*"; }
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    step "creating the virtualenv .venv ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.tank-log-installed
pyx=$(find tank_log -name '*.pyx' | sort)
pxd=$(find tank_log -name '*.pxd' | sort)  # C declarations and inline helpers the .pyx files cimport
want=$(cat pyproject.toml setup.py $pyx $pxd | sha256sum | cut -d' ' -f1)
missing=0
for f in $pyx; do
    ls "${f%.pyx}".*.so >/dev/null 2>&1 || missing=1
done
# pip's progress: one line per package it collects and per wheel it builds; all of its output when it fails
pip_install() {
    local log
    log=$(mktemp)
    if ! .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 | tee "$log" |
        { grep --line-buffered -E '^(Collecting|Building wheel|Installing collected)' | sed -u 's/^/  pip: /' || true; }
    then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ "$missing" = 1 ]; then
    step "installing Python packages into .venv (several minutes on a first run: pyspark and Airflow are large;"
    step "  ~2 GB) and compiling tank-log's codec core (Cython, gcc)"
    .venv/bin/python -m pip install --quiet --upgrade pip
    TANK_LOG_REQUIRE_NATIVE=1 pip_install -e ".[dev,airflow]"
    # Airflow's Spark provider pulls pyspark-client (Spark Connect's client: a copy of pyspark's Python files) at its
    # newest release, which may overwrite pyspark's own: keep it on pyspark's line, and pyspark's files on top
    spark_v=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyspark"))')
    if [ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)" != "$spark_v" ]; then
        pip_install "pyspark-client~=${spark_v%.*}.0"
        pip_install --no-deps --force-reinstall "pyspark==$spark_v"
    fi
    echo "$want" > "$stamp"
    step "Python packages installed"
else
    step "Python packages: up to date in .venv"
fi
# promtool (Debian's prometheus package) checks and unit-tests the alert rules (conf/prometheus, tests/alerts/):
# installed when missing and apt-get can run (as root, as in CI). The package's server is not wanted: under systemd
# it is stopped and disabled again.
if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        step "installing promtool (apt-get install prometheus)"
        install_prometheus() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
        }
        install_prometheus || { apt-get update -qq && install_prometheus; }
        if [ -d /run/systemd/system ]; then
            systemctl disable --now prometheus.service >/dev/null 2>&1 || true
        fi
    else
        echo "setup: promtool is missing (Debian: apt-get install prometheus, as root); the alert tests need it" >&2
    fi
fi
# The lakehouse jars for Spark 4.1 (delta-spark, delta-storage; Iceberg's Spark runtime and SQLite's JDBC driver;
# hadoop-aws and its AWS SDK for s3a://), fetched once with Maven into .jars/ (tank_spark/jars.py; ~700 MB, mostly
# the AWS SDK, cached in ~/.m2): skipped when present for this scripts/spark-jars/pom.xml and pyspark. Jobs never
# fetch anything. Needs mvn (apt-get install maven).
step "the lakehouse jars for Spark in .jars/ (a first run fetches them with Maven: ~700 MB, a few minutes)"
.venv/bin/python -m tank_spark.jars install
# The Apache Iceberg reference REST catalog server (iceberg-open-api's test fixture, with Iceberg's core, Jetty,
# Hadoop's client and SQLite's JDBC driver: scripts/iceberg-rest/pom.xml, ~85 MB) for the tests of tables by name,
# fetched once with Maven into .jars/iceberg-rest/ (the lakehouse jars' step keeps it when it refills .jars/).
step "the Iceberg REST catalog server's jars in .jars/iceberg-rest/ (a first run fetches them with Maven: ~85 MB)"
bash scripts/iceberg-rest-catalog.sh install
# Spark drivers map a class-data archive of their JDK and Spark jars (tank_spark/class_archive.py): ~4 s less per
# job start. Built once (~40 s on an idle machine, minutes under load), again after Spark or the JDK changed; a driver
# without it just starts slower.
step "Spark's class archive in ~/.cache/tank-log/ (built once: ~40 s on an idle machine, several minutes under load)"
.venv/bin/python -m tank_spark.class_archive --if-missing | sed -u 's/^/  /' ||
    echo "setup: no Spark class archive built; jobs start without it" >&2
# The docs site's diagram library, served by the site itself so that it works offline (Material loads Mermaid from a
# CDN unless the page has it): mermaid's browser bundle from the npm registry, pinned and checked, into the
# git-ignored docs/assets/vendor/ (mkdocs.yml: extra_javascript).
MERMAID_VERSION=11.17.2
MERMAID_SHA256=581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8
mermaid=docs/assets/vendor/mermaid.min.js
if [ "$(sha256sum "$mermaid" 2>/dev/null | cut -d' ' -f1)" != "$MERMAID_SHA256" ]; then
    if command -v npm >/dev/null; then
        step "fetching mermaid@$MERMAID_VERSION for the docs site (npm) into $(dirname "$mermaid")/"
        tmp=$(mktemp -d)
        (cd "$tmp" && npm pack --silent "mermaid@$MERMAID_VERSION" >/dev/null &&
            tar xzf "mermaid-$MERMAID_VERSION.tgz" package/dist/mermaid.min.js)
        if [ "$(sha256sum "$tmp/package/dist/mermaid.min.js" | cut -d' ' -f1)" = "$MERMAID_SHA256" ]; then
            mkdir -p "$(dirname "$mermaid")"
            mv "$tmp/package/dist/mermaid.min.js" "$mermaid.tmp" && mv "$mermaid.tmp" "$mermaid"
        else
            echo "setup: mermaid@$MERMAID_VERSION from npm does not match its pinned checksum; not installed" >&2
        fi
        rm -rf "$tmp"
    else
        echo "setup: no npm: the docs site's diagrams need docs/assets/vendor/mermaid.min.js (mermaid@$MERMAID_VERSION)" >&2
    fi
fi
# Headless Chromium and its WebDriver for the browser test of the docs site (tests/test_docs_site.py), from Debian's
# packages, installed only when missing (as root; elsewhere that test is skipped and says why).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        step "installing headless Chromium for the docs' browser tests (apt-get install chromium chromium-driver)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "setup: no chromium/chromedriver (apt-get install chromium chromium-driver); the docs browser test skips" >&2
    fi
fi
step "done"
