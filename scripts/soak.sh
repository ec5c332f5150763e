#!/usr/bin/env bash
# Abuse soak of `tessera serve` on 127.0.0.1 (docs/server.md, "Abuse soak"):
#   1. quiet: 8 well-behaved streaming clients for SECONDS; their time to first token;
#   2. abuse: the same clients while 500 slow-loris connections, 1,000 malformed or
#      oversized requests and 200 clients that disconnect mid-stream hit the server;
#   3. quiet again (runs alternate: this machine's speed drifts);
# then, once the server is idle: tessera_requests_running and tessera_kv_pages_used
# from /metrics (target 0) and the server's open file descriptors against their count
# before the abuse (target within 8). Exits 1 when a target is missed.
#
#   scripts/soak.sh [BUILD_DIR=build] [MODEL] [SECONDS=20]
#
# MODEL defaults to BUILD_DIR/share/tessera/models/default.gguf (the default_model
# target), else the llama-q8_0 fixture. Needs node (bench/server_soak.cjs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
model=${2:-}
secs=${3:-20}
bin=$build/bin/tessera
[ -x "$bin" ] || { echo "soak: $bin is not built" >&2; exit 1; }
if [ -z "$model" ]; then
  model=$build/share/tessera/models/default.gguf
  [ -f "$model" ] || model=$root/../shared/fixtures/models/llama-q8_0.gguf
fi
[ -f "$model" ] || { echo "soak: no model ($model)" >&2; exit 1; }
soak="node $root/bench/server_soak.cjs"
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# --parallel 12: the 8 good clients and the 4 disconnecting ones at a time all fit;
# --max-body 1M keeps the oversized bodies cheap to send.
"$bin" serve -m "$model" --port 0 --threads 1 --parallel 12 --max-body 1M >"$tmp/out" 2>"$tmp/err" &
server_pid=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/out" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$tmp/out")
[ -n "$url" ] || { echo "soak: the server did not start:" >&2; cat "$tmp/err" >&2; exit 1; }
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
fds() { ls "/proc/$server_pid/fd" | wc -l; }
echo "server: $url (pid $server_pid), model $(basename "$model"), $secs s per run"

$soak good "$url" 3 8 >/dev/null  # warm-up
$soak good "$url" "$secs" >"$tmp/quiet1.json"
fd_before=$(fds)
$soak abuse "$url" 500 1000 200 </dev/null >"$tmp/abuse_counts" &
abuse_pid=$!
for _ in $(seq 300); do grep -q ready "$tmp/abuse_counts" && break; sleep 0.1; done
grep -q ready "$tmp/abuse_counts" || { echo "soak: the abuse client did not start" >&2; exit 1; }
echo "abuse: 500 slow-loris connections open; $(metric tessera_http_connections_open) connections served"
# The good clients run until the malformed and disconnecting requests are all sent (at most 10 x SECONDS).
SOAK_UNTIL_FILE=$tmp/abuse_counts $soak good "$url" $((secs * 10)) >"$tmp/abuse.json"
kill -TERM "$abuse_pid"
wait "$abuse_pid" || true
abuse_counts=$(tail -n 1 "$tmp/abuse_counts")
$soak good "$url" "$secs" >"$tmp/quiet2.json"
# The server settles: refused connections linger at most 1 s, cancelled requests end at the next step.
for _ in $(seq 50); do [ "$(metric tessera_requests_running)" = 0 ] && break; sleep 0.1; done
sleep 2
fd_after=$(fds)

node - "$tmp" "$fd_before" "$fd_after" "$(metric tessera_requests_running)" "$(metric tessera_kv_pages_used)" \
     "$abuse_counts" "$(metric tessera_requests_cancelled_total)" "$(metric tessera_http_connections_refused_total)" \
     "$(metric tessera_http_requests_refused_total)" <<'EOF'
const fs = require('node:fs');
const [dir, fdBefore, fdAfter, running, kvUsed, abuseCounts, cancelled, connRefused, reqRefused] = process.argv.slice(2);
const load = (n) => JSON.parse(fs.readFileSync(`${dir}/${n}.json`, 'utf8'));
const q1 = load('quiet1'), ab = load('abuse'), q2 = load('quiet2');
const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };
const line = (name, r) => console.log(`${name.padEnd(6)} requests ${String(r.requests).padStart(4)}  failed ${r.failures}  TTFT p50 ${pct(r.ttft_ms, 0.5).toFixed(1)} ms  p90 ${pct(r.ttft_ms, 0.9).toFixed(1)} ms${r.errors.length ? '  errors: ' + r.errors.join('; ') : ''}`);
line('quiet', q1); line('abuse', ab); line('quiet', q2);
console.log(`the abuse run lasted ${ab.seconds} s`);
const quietP50 = (pct(q1.ttft_ms, 0.5) + pct(q2.ttft_ms, 0.5)) / 2;
const ratio = pct(ab.ttft_ms, 0.5) / quietP50;
console.log(`abuse counts: ${abuseCounts}`);
console.log(`server: requests cancelled ${cancelled}, connections refused (503) ${connRefused}, requests refused by a limit ${reqRefused}`);
console.log(`TTFT p50 under abuse / quiet: ${ratio.toFixed(2)}x (target <= 2)`);
console.log(`afterwards: tessera_requests_running ${running} (target 0), tessera_kv_pages_used ${kvUsed} (target 0), open fds ${fdBefore} before, ${fdAfter} after (target within 8)`);
const ok = ratio <= 2 && ab.failures === 0 && Number(running) === 0 && Number(kvUsed) === 0 && Math.abs(fdAfter - fdBefore) <= 8;
console.log(ok ? 'soak: PASS' : 'soak: FAIL');
process.exit(ok ? 0 : 1);
EOF
