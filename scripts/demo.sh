#!/usr/bin/env bash
# Runs the demo: builds the word-count circuit and runs it with W=2 on the
# embedded backend over bundled text.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run -p sluice --bin sluice -- demo "$@"
