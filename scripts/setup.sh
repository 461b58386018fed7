#!/usr/bin/env bash
# Installs what building and testing Sluice needs on a fresh Debian machine,
# and nothing when it is already there: libclang (RocksDB's bindings are
# generated with bindgen), kcat (the Kafka tests' independent consumer) and
# the wasm32-wasip2 target (rust-toolchain.toml also asks rustup
# for it).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need_apt+=(libclang-dev)
fi
command -v make >/dev/null || need_apt+=(make)
command -v g++ >/dev/null || need_apt+=(g++)
# kcat: the independent Kafka consumer the Kafka tests check output with.
command -v kcat >/dev/null || need_apt+=(kcat)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if command -v rustup >/dev/null; then
  toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  if ! rustup target list --installed --toolchain "$toolchain" 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "setup: adding the wasm32-wasip2 target" >&2
    rustup target add --toolchain "$toolchain" wasm32-wasip2
  fi
fi
