#!/usr/bin/env bash
# Runs every test: unit, property, conformance and end-to-end (crash) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo test --workspace "$@"
