#!/usr/bin/env bash
# Builds the native peers `sluice bench` measures Sluice against, outside the
# Sluice workspace and its target directory, so that CI never pays for them:
#   benches/peers/dbsp-wordcount  -> ~/.cache/sluice/peers/dbsp-wordcount
# (the `dbsp` crate 0.349 from crates.io; a cold build takes ~10 min on two
# cores). `sluice bench` finds them there, or says "peer not built" and
# points here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${SLUICE_PEERS_DIR:-$HOME/.cache/sluice/peers}"
mkdir -p "$out"
for peer in dbsp-wordcount; do
    echo "building peer $peer (release) ..." >&2
    # The peer's Cargo.lock pins what was measured.
    CARGO_TARGET_DIR="$out/target" cargo build --release --locked \
        --manifest-path "$root/benches/peers/$peer/Cargo.toml"
    cp "$out/target/release/$peer" "$out/$peer"
    echo "$out/$peer" >&2
done
