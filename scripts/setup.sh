#!/usr/bin/env bash
# Installs what building and testing Sluice needs on a fresh Debian machine,
# and nothing when it is already there: libclang-dev (RocksDB's bindings are
# generated with bindgen, which loads libclang), make and g++ (RocksDB's and
# librdkafka's C/C++), kcat (the Kafka tests' independent consumer), protoc
# (the etcd client's generated code) and the wasm32-wasip2 target (rust-toolchain.toml also asks rustup for it).
#
#   scripts/setup.sh            install what building and the demo need
#   scripts/setup.sh --tests    also what the tests need: Debian's chromium
#                               (the console's browser test) and, in
#                               tests/browser, playwright-core from npm;
#                               schemathesis and moto[server] from PyPI in a
#                               virtualenv under ~/.cache/sluice (the API
#                               document's test; the S3-protocol server)
#                               and componentize-py (as --python does)
#   scripts/setup.sh --python   also componentize-py, pinned, from PyPI into
#                               that virtualenv: `sluice build` of a Python
#                               circuit runs it
#   scripts/setup.sh --dry-run  print what would be installed, install nothing
#
# Packages are checked with dpkg, never by looking for a file that might
# belong to another package: a fresh image ships `libclang-cpp.so.14` (a
# different library, from libclang-cpp14) while bindgen needs libclang itself
# and its headers, so a file glob once skipped libclang-dev and the build
# failed twelve minutes later. tests/setup/check-setup.sh pins that case.
#
# Environment (for tests of this script): SLUICE_DPKG_ADMINDIR points dpkg at
# another status database (a fresh root's /var/lib/dpkg); SLUICE_SETUP_PATH
# replaces PATH when looking for commands.
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
tests=0
python=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    --tests) tests=1; python=1 ;;
    --python) python=1 ;;
    *) echo "setup: unknown argument $arg (use --tests, --python, --dry-run)" >&2; exit 2 ;;
  esac
done

dpkg_args=()
[ -n "${SLUICE_DPKG_ADMINDIR:-}" ] && dpkg_args+=(--admindir="$SLUICE_DPKG_ADMINDIR")

# True when Debian package $1 is installed (not merely known or removed).
installed() {
  [ "$(dpkg-query "${dpkg_args[@]}" -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# True when command $1 is on the search path.
have_command() {
  PATH="${SLUICE_SETUP_PATH:-$PATH}" command -v "$1" >/dev/null 2>&1
}

need_apt=()
# bindgen needs libclang.so and clang's resource headers: both come with
# libclang-dev. LIBCLANG_PATH is the user's explicit choice of another one.
if [ -z "${LIBCLANG_PATH:-}" ] && ! installed libclang-dev; then
  need_apt+=(libclang-dev)
fi
have_command make || need_apt+=(make)
have_command g++ || need_apt+=(g++)
# kcat: the independent Kafka consumer the Kafka tests check output with.
have_command kcat || need_apt+=(kcat)
# protoc: the etcd client's build generates its gRPC code (membership).
have_command protoc || need_apt+=(protobuf-compiler)

if [ "$tests" -eq 1 ]; then
  # The console test drives Debian's Chromium (a test tool's own browser
  # download cannot reach its servers from here).
  installed chromium || need_apt+=(chromium)
  # curl: scripts/test.sh waits for the S3-protocol server and makes its bucket.
  have_command curl || need_apt+=(curl)
  # etcd: the membership tests' server (scripts/test.sh starts it on loopback).
  installed etcd-server || need_apt+=(etcd-server)
fi

if [ "$dry_run" -eq 1 ]; then
  echo "setup: would install: ${need_apt[*]:-nothing}"
  exit 0
fi

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

if [ "$tests" -eq 1 ]; then
  # playwright-core, pinned by tests/browser/package-lock.json, for Node.js
  # 20 or newer (the machine's; Debian's own nodejs is older).
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "setup: the console test needs Node.js 20+ and npm on the PATH" >&2
    exit 1
  fi
  if [ ! -d tests/browser/node_modules/playwright-core ]; then
    echo "setup: installing playwright-core in tests/browser" >&2
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

if [ "$tests" -eq 1 ]; then
  # schemathesis, pinned, in its own virtualenv (tests/e2e/api.rs finds it
  # there, or through SLUICE_SCHEMATHESIS).
  venv="${SLUICE_VENV:-$HOME/.cache/sluice/venv}"
  if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "setup: installing schemathesis into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check schemathesis==4.32.5
  fi
  # moto's server: the S3-protocol server the object-store checkpoint tests
  # run against (scripts/test.sh starts it on loopback).
  if [ ! -x "$venv/bin/moto_server" ]; then
    echo "setup: installing moto[server] into $venv" >&2
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'moto[server]==5.2.1'
  fi
  # DuckDB: the Nexmark tests' oracle (tests/nexmark/oracle.py runs each
  # query's SQL over the same events; a prebuilt wheel).
  if ! "$venv/bin/python" -c 'import duckdb' 2>/dev/null; then
    echo "setup: installing duckdb into $venv" >&2
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'duckdb==1.4.2'
  fi
fi

if [ "$python" -eq 1 ]; then
  # componentize-py, pinned (host/tools/src/python.rs names the same
  # version): CPython and a Python circuit in one component.
  venv="${SLUICE_VENV:-$HOME/.cache/sluice/venv}"
  want=0.25.1
  have=$("$venv/bin/componentize-py" --version 2>/dev/null | awk '{print $2}' || true)
  if [ "$have" != "$want" ]; then
    echo "setup: installing componentize-py $want into $venv" >&2
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$want"
  fi
fi
