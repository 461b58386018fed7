#!/usr/bin/env bash
# The Kafka-protocol broker Sluice's tests run against: the workplace's
# broker (../shared/kafka-broker: crabka-broker 0.3.0 with two fixes), built
# with two more fixes of ours in scripts/kafka-broker/:
# - crabka-txn-control-lock.patch: without it, an InitProducerId racing an
#   EndTxn (a second host taking over while the first commits a step) could
#   leave the first host unfenced, or abort and commit the same transaction:
#   the fencing test failed about one run in five, once with a step
#   committed twice.
# - crabka-txn-timeout.patch: as Apache Kafka, the broker aborts a
#   transaction open longer than its transaction.timeout.ms (checked every
#   second; the producer's epoch is bumped, fencing it), and answers a
#   read_committed client's latest-offset query with the last stable offset
#   (the unpatched broker answered the log end even behind an open
#   transaction, so no test could see a dead producer hold the LSO back).
#   It also finishes a transaction left prepared (PrepareCommit or
#   PrepareAbort: the broker stopped between an EndTxn's prepare and its
#   markers), on the next tick or InitProducerId, as Kafka's coordinator
#   does on load: with the open transactions rebuilt after a restart (the
#   next patch), such a transaction held its partitions' last stable offset
#   back for good (the fault campaign's broker-restart trial saw no step
#   for 180 s).
# - crabka-log-restart-txn-state.patch (to its crabka-log dependency): a
#   partition's open transactions and last stable offset lived in memory
#   only, so after a restart every record of a transaction open at the stop
#   read as committed and its later abort was not indexed: read_committed
#   readers saw aborted records (a step's output twice; the broker-restart
#   test failed about one CI run in four). They are rebuilt from the log
#   when a partition opens.
# - crabka-fence-epoch.patch and crabka-log-fence-epoch.patch: a producer
#   fenced by another InitProducerId of its transactional id (or timed out)
#   had its epoch bumped only after the abort markers, which carried the old
#   one, and a partition appended any batch the coordinator had checked: a
#   send in flight at the fence landed after the abort marker and opened a
#   transaction that the id's next commit marker closed, committing the
#   fenced producer's records (tests/e2e/broker.rs: over a million of them in
#   30 rounds; the fault campaign: a word count off the recount). Now the
#   epoch is bumped before the markers, which carry it, and a partition
#   refuses a transactional batch of an epoch older than a marker it holds,
#   under the append's lock, as Kafka's producer state does. The LSO also
#   moves to the earliest open transaction's start when another one closes
#   (it waited for every one to close).
# - crabka-producer-state-restart.patch and
#   crabka-log-producer-state-restart.patch: an idempotent producer's
#   sequences were checked against state kept in memory only (empty after a
#   restart) and apart from the append: a batch appended just before a
#   broker restart, whose acknowledgement was lost, was appended again when
#   the producer retried it, inside the same transaction, which then
#   committed both (the fault campaign: a step's output records read twice
#   after a broker restart). Each partition now rebuilds its producers'
#   epochs and last five batches from the log when it opens, as Kafka does,
#   and checks a batch's sequence under the append's lock, answering a
#   retry with the first append's offset (tests/e2e/broker.rs).
#
#   scripts/kafka-broker.sh install             build once (~10 min cold on 2 cores)
#   scripts/kafka-broker.sh start PORT DIR      as the shared script: prints the address
#   scripts/kafka-broker.sh start-at IP:PORT DIR as start, on another loopback address: a
#                                               broker's controller listens on port 9093 of
#                                               its own address, so a second broker beside the
#                                               tests' one (a test that restarts its own) needs
#                                               another, e.g. 127.0.0.2
#   scripts/kafka-broker.sh stop DIR
#
# SLUICE_KAFKA_BROKER_SHARED names the shared broker directory (default: the
# workplace's ../shared/kafka-broker or /work/shared/kafka-broker).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${SLUICE_KAFKA_BROKER_SHARED:-}
if [ -z "$SHARED" ]; then
  for candidate in "$HERE/../../shared/kafka-broker" /work/shared/kafka-broker; do
    if [ -x "$candidate/kafka-broker.sh" ]; then SHARED=$(cd "$candidate" && pwd); break; fi
  done
fi
[ -n "$SHARED" ] || { echo "kafka-broker: the shared broker directory was not found (set SLUICE_KAFKA_BROKER_SHARED)" >&2; exit 1; }
export KB_HOME=${SLUICE_KB_HOME:-$HOME/.cache/sluice-kafka-broker-patched}
BIN=$KB_HOME/bin/crabka-broker
PATCHES=("$SHARED/crabka-replay-txn-markers.patch" "$SHARED/crabka-fetch-empty-records.patch" \
         "$HERE/kafka-broker/crabka-txn-control-lock.patch" "$HERE/kafka-broker/crabka-txn-timeout.patch" \
         "$HERE/kafka-broker/crabka-fence-epoch.patch" "$HERE/kafka-broker/crabka-producer-state-restart.patch")
# Patches to the broker's crabka-log dependency, built in as a path override.
LOG_PATCHES=("$HERE/kafka-broker/crabka-log-restart-txn-state.patch" "$HERE/kafka-broker/crabka-log-fence-epoch.patch" \
             "$HERE/kafka-broker/crabka-log-producer-state-restart.patch")
VER=0.3.0

# The patches the installed binary was built with: a changed patch rebuilds.
stamp() { cat "${PATCHES[@]}" "${LOG_PATCHES[@]}" | sha256sum | cut -c1-16; }

install() {
  if [ -x "$BIN" ] && [ "$(cat "$KB_HOME/bin/stamp" 2>/dev/null)" = "$(stamp)" ]; then return 0; fi
  mkdir -p "$KB_HOME/bin" "$KB_HOME/fetch/src"
  # The release is yanked (renamed upstream): reached through the shared lockfile.
  cp "$SHARED/fetch/Cargo.toml" "$SHARED/fetch/Cargo.lock" "$KB_HOME/fetch/"
  chmod u+w "$KB_HOME/fetch/Cargo.toml" "$KB_HOME/fetch/Cargo.lock"
  echo 'fn main() {}' > "$KB_HOME/fetch/src/main.rs"
  (cd "$KB_HOME/fetch" && cargo fetch --locked -q)
  local src
  src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/crabka-broker-$VER | head -n 1)
  rm -rf "$KB_HOME/src" && cp -r "$src" "$KB_HOME/src" && chmod -R u+w "$KB_HOME/src"
  for p in "${PATCHES[@]}"; do (cd "$KB_HOME/src" && patch -s -p1 < "$p"); done
  local log_src
  log_src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/crabka-log-$VER | head -n 1)
  rm -rf "$KB_HOME/crabka-log" && cp -r "$log_src" "$KB_HOME/crabka-log" && chmod -R u+w "$KB_HOME/crabka-log"
  for p in "${LOG_PATCHES[@]}"; do (cd "$KB_HOME/crabka-log" && patch -s -p1 < "$p"); done
  printf '\n[patch.crates-io]\ncrabka-log = { path = "../crabka-log" }\n' >> "$KB_HOME/src/Cargo.toml"
  # The broker's own lockfile, its dev-dependencies included (cargo
  # resolves them for a build too): the fetch above did not get those, and
  # a fresh machine has no other copy (a build there failed: "no matching
  # package named `temp-env`"). Not --locked: the override changes
  # crabka-log's lock entry.
  (cd "$KB_HOME/src" && cargo fetch -q)
  (cd "$KB_HOME/src" && CARGO_TARGET_DIR="$KB_HOME/target" cargo build --release --offline -q --bin crabka-broker)
  # Renamed into place: a broker started from the old binary keeps running.
  cp "$KB_HOME/target/release/crabka-broker" "$BIN.new" && mv -f "$BIN.new" "$BIN"
  stamp > "$KB_HOME/bin/stamp"
}

start_at() {
  local addr=$1 dir=$2 fresh=0
  install
  mkdir -p "$dir"
  if [ ! -f "$dir/meta.properties.json" ]; then
    fresh=1
    python3 -c 'import uuid,json;print(json.dumps({"directory_id":str(uuid.uuid4())}))' > "$dir/meta.properties.json"
  fi
  RUST_LOG=${RUST_LOG:-warn} nohup "$BIN" --listen-addr "$addr" --log-dir "$dir" \
      --metrics-listen-addr none --cluster-id 6b1c1d2e-0000-4000-8000-000000000001 \
      >> "$dir.log" 2>&1 &
  echo $! > "$dir.pid"
  for _ in $(seq 1 100); do
    kill -0 "$(cat "$dir.pid")" 2>/dev/null || { tail -5 "$dir.log" >&2; exit 1; }
    (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null && break
    sleep 0.1
  done
  if [ $fresh = 1 ]; then
    python3 "$SHARED/update_features.py" "$addr" transaction.version 1 2 >/dev/null
  fi
  echo "$addr"
}

case "${1:-}" in
  install) install ;;
  start-at) shift; start_at "$@" ;;
  start) install; exec "$SHARED/kafka-broker.sh" "$@" ;;
  *) exec "$SHARED/kafka-broker.sh" "$@" ;;
esac
