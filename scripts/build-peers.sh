#!/usr/bin/env bash
# Builds the native peers `sluice bench` measures Sluice against, outside the
# Sluice workspace and its target directory, so that CI never pays for them:
#   benches/peers/dbsp-wordcount  -> ~/.cache/sluice/peers/dbsp-wordcount
#       (the `dbsp` crate 0.349 from crates.io; a cold build takes ~10 min
#       on two cores)
#   benches/peers/dbsp-nexmark    -> ~/.cache/sluice/peers/dbsp-nexmark
#       (Feldera's own Nexmark, `crates/nexmark` of the feldera repository
#       at the commit below, with its bench command, against the same
#       `dbsp` 0.349 from crates.io; Sluice holds none of its code: the
#       crate is taken from FELDERA_SRC, a feldera checkout, or cloned from
#       GitHub, and built beside our manifest in ~/.cache/sluice/peers)
# `sluice bench` finds them there, or says "peer not built" and points here.
#
#   scripts/build-peers.sh                  both
#   scripts/build-peers.sh dbsp-nexmark     one
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${SLUICE_PEERS_DIR:-$HOME/.cache/sluice/peers}"
# The feldera commit the Nexmark peer was measured at (its workspace is
# version 0.337; the crate builds unchanged against dbsp 0.349).
feldera_commit=5c7931d09fc37e0976143e50a81169dbd98ec0cc
mkdir -p "$out"
peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(dbsp-wordcount dbsp-nexmark)
for peer in "${peers[@]}"; do
    echo "building peer $peer (release) ..." >&2
    case "$peer" in
        dbsp-wordcount)
            # The peer's Cargo.lock pins what was measured.
            CARGO_TARGET_DIR="$out/target" cargo build --release --locked \
                --manifest-path "$root/benches/peers/$peer/Cargo.toml"
            cp "$out/target/release/$peer" "$out/$peer"
            ;;
        dbsp-nexmark)
            src="${FELDERA_SRC:-}"
            if [ -z "$src" ]; then
                src="$out/feldera"
                if [ ! -d "$src/.git" ]; then
                    git clone --filter=blob:none --no-checkout https://github.com/feldera/feldera "$src" || {
                        rm -rf "$src"
                        echo "could not clone feldera: set FELDERA_SRC to a feldera checkout of commit $feldera_commit" >&2
                        exit 1
                    }
                fi
                git -C "$src" checkout -q "$feldera_commit" -- crates/nexmark
            fi
            [ -d "$src/crates/nexmark/src" ] || { echo "no crates/nexmark in $src (FELDERA_SRC)" >&2; exit 1; }
            build="$out/dbsp-nexmark-src"
            rm -rf "$build" && mkdir -p "$build"
            cp -r "$src/crates/nexmark/src" "$src/crates/nexmark/benches" "$build/"
            cp "$root/benches/peers/$peer/Cargo.toml" "$root/benches/peers/$peer/Cargo.lock" "$build/"
            CARGO_TARGET_DIR="$out/target" cargo build --release --locked \
                --manifest-path "$build/Cargo.toml" --bin "$peer"
            cp "$out/target/release/$peer" "$out/$peer"
            ;;
        *) echo "no such peer: $peer (dbsp-wordcount, dbsp-nexmark)" >&2; exit 1 ;;
    esac
    echo "$out/$peer" >&2
done
