#!/usr/bin/env bash
# Installs DuckDB's Python package for the optional baseline of `scripts/duckdb_baseline.py`.
# Never needed by the tests or CI.
set -euo pipefail
python3 -m pip install --quiet --disable-pip-version-check "duckdb>=1.1"
python3 -c "import duckdb; print('duckdb', duckdb.__version__)"
