#!/usr/bin/env bash
# Runs the demo: builds the word-count circuit and runs it with W=2 on the
# embedded backend over bundled text.
#
# The demo needs only the embedded backend, so its build leaves out the
# Kafka backend (librdkafka's C build): `cargo run -p sluice` with default
# features, as the rest of the README uses, builds it in beside this one.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run -p sluice --no-default-features --bin sluice -- demo "$@"
