#!/bin/bash
# callgrind.sh CASE...: for each of scriptcost's cases (return1, gcra,
# granted, queued, batch), start a redis-server under valgrind's callgrind
# on a free loopback port, make the call N times (default 1000) with
# scriptcost, stop the server, and print the instructions the server
# executed per call, less those of a run with no calls (start-up, loading,
# INFO). BATCH=m sends m callers per call of the batch case. Instruction
# counts, unlike timings, do not depend on what else the machine is doing.
set -euo pipefail
cd "$(dirname "$0")/../../.."
N=${N:-1000}
go build -o /tmp/scriptcost.$$ ./internal/bench/scriptcost
trap 'rm -f /tmp/scriptcost.$$ /tmp/scriptcost.$$.cg.*' EXIT
instr() { # instr FILE CALLS: total instructions of one server's life
  local port out pid
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  out=/tmp/scriptcost.$$.cg.$port
  valgrind --tool=callgrind --callgrind-out-file="$out" redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  /tmp/scriptcost.$$ -addr "127.0.0.1:$port" -batch "${BATCH:-100}" -n "$2" "$1" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
for f in "$@"; do
  base=$(instr "$f" 0)
  total=$(instr "$f" "$N")
  echo "$f $(( (total - base) / N )) instructions/call"
done
