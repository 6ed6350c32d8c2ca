#!/usr/bin/env bash
# Drain rate of Tributary's change streams against PostgreSQL's logical decoding, on this
# machine, one after the other: the same rows (100,000 by default) written in the same number of
# writes (100 batches of 1,000), then read back by one consumer from before the first write.
#
#   bash bench/compare-postgres.sh            # ROWS=... BATCHES=... to change the load
#
# PostgreSQL comes from Debian's packages (installed when missing) and runs as the postgres
# user in a temporary directory on a free port; pg_recvlogical reads a test_decoding slot up to
# the WAL position after the last insert. Tributary: `tributary-bench --drain` (release build)
# against its own embedded cluster. Prints both rates and their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-100000}
BATCHES=${BATCHES:-100}
PER=$((ROWS / BATCHES))

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d)
chown postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg() { su postgres -s /bin/bash -c "$*"; }
cleanup() { as_pg "$PGBIN/pg_ctl -D $dir/data -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
as_pg "$PGBIN/initdb -D $dir/data -A trust" >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
port = $port
CONF
as_pg "$PGBIN/pg_ctl -D $dir/data -l $dir/log -w start" >/dev/null
psql_() { psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt "$@"; }
psql_ -c "create table t (id int primary key, payload text)"
psql_ -c "select pg_create_logical_replication_slot('bench', 'test_decoding')" >/dev/null
for b in $(seq 0 $((BATCHES - 1))); do
  psql_ -c "insert into t select g, repeat('x', 100) from generate_series($((b * PER)), $((b * PER + PER - 1))) g"
done
end=$(psql_ -c "select pg_current_wal_lsn()")
start=$(date +%s.%N)
got=$(pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d postgres --slot bench --start \
  --endpos "$end" -f - | grep -c '^table public.t: INSERT')
secs=$(python3 -c "print($(date +%s.%N) - $start)")
pg_rate=$(python3 -c "print($got / $secs)")
printf 'PostgreSQL pg_recvlogical: %d rows in %.2fs = %.0f rows/s\n' "$got" "$secs" "$pg_rate"

cargo build --release --quiet --bin tributary --bin tributary-bench
json=$(mktemp)
TRIBUTARY_BIN=target/release/tributary target/release/tributary-bench --writers 1 \
  --batch "$PER" --docs "$ROWS" --watchers 1 --drain --json "$json" 2>/dev/null >/dev/null
tr_rate=$(python3 -c "import json,sys; print(json.load(open('$json'))['events_per_sec'])")
tr_events=$(python3 -c "import json,sys; print(json.load(open('$json'))['events'])")
rm -f "$json"
printf 'Tributary --drain: %d events = %.0f events/s\n' "$tr_events" "$tr_rate"
printf 'ratio Tributary / PostgreSQL: %.2f\n' "$(python3 -c "print($tr_rate / $pg_rate)")"
