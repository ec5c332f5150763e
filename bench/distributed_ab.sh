#!/usr/bin/env bash
# Run A against run B, alternated (docs/distributed.md, "Measured"):
#   A: `mpirun -np 2` ranks, one thread each, experts split and all resident
#      (--expert-cache off), each rank in its own memory cgroup of LIMIT;
#   B: one process, two threads, streaming the experts through a cache of CACHE
#      (--expert-cache CACHE), in one memory cgroup of LIMIT.
# Prints each run's decode and prefill tok/s (medians of `tessera bench`'s reps) and the
# peak memory of each cgroup (its page cache included) and each process's peak RSS.
#
# usage: bench/distributed_ab.sh MODEL [PAIRS=2] [LIMIT=12G] [CACHE=8G]
#   TESSERA (default build/bin/tessera), BENCH_ARGS (default "-p 16 -n 32 -r 3").
# Needs root (it makes cgroups under the memory controller: cgroup v2, or v1's memory
# hierarchy) and Open MPI's mpirun.
set -euo pipefail
MODEL=${1:?usage: bench/distributed_ab.sh MODEL [PAIRS] [LIMIT] [CACHE]}
PAIRS=${2:-2}
LIMIT=${3:-12G}
CACHE=${4:-8G}
TESSERA=${TESSERA:-build/bin/tessera}
BENCH_ARGS=${BENCH_ARGS:-"-p 16 -n 32 -r 3"}
BENCH_ARGS="$BENCH_ARGS --membw-mib 0 --peak-runs 0 --json"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

bytes() { numfmt --from=iec "$1"; }
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  CG_ROOT=/sys/fs/cgroup V=2
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
elif [ -d /sys/fs/cgroup/memory ]; then
  CG_ROOT=/sys/fs/cgroup/memory V=1
else
  echo "distributed_ab: no memory cgroup controller found" >&2; exit 1
fi
echo "cgroups: v$V under $CG_ROOT, limit $LIMIT each, no swap"

make_cg() {  # NAME -> a fresh cgroup with the limit
  local d=$CG_ROOT/tessera_ab_$1
  [ -d "$d" ] && rmdir "$d"
  mkdir "$d"
  if [ $V = 2 ]; then
    echo "$(bytes "$LIMIT")" > "$d/memory.max"
    [ -f "$d/memory.swap.max" ] && echo 0 > "$d/memory.swap.max"
  else
    echo "$(bytes "$LIMIT")" > "$d/memory.limit_in_bytes"
    [ -f "$d/memory.memsw.limit_in_bytes" ] && echo "$(bytes "$LIMIT")" > "$d/memory.memsw.limit_in_bytes"
  fi
  echo "$d"
}
peak_of() {  # cgroup dir -> its peak usage in MiB
  local f=$1/memory.max_usage_in_bytes
  [ $V = 2 ] && f=$1/memory.peak
  if [ -f "$f" ]; then echo $(( $(cat "$f") / 1048576 )); else echo "?"; fi
}
summary() {  # JSON file -> "decode X tok/s, prefill Y tok/s"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); d=j.get("distributed",{});
p=j.get("prefill"); print("decode %.3f tok/s%s%s" % (j["decode"]["tok_s_median"], ", prefill %.2f tok/s" % p["tok_s_median"] if p else "",
      ", exchanges %.1f KB and %.2f ms a token" % (d["comm_bytes_per_token"]/1e3, d["comm_seconds_per_token"]*1e3) if d else ""))' "$1"
}

# Each run starts from an empty page cache (when this may drop it), so each cgroup is
# charged for the file pages its own processes read.
drop_caches() { sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

run_a() {
  local c0 c1
  drop_caches
  c0=$(make_cg rank0); c1=$(make_cg rank1)
  mpirun -np 2 --bind-to core sh -c 'echo $$ > '"$CG_ROOT"'/tessera_ab_rank$OMPI_COMM_WORLD_RANK/cgroup.procs &&
    exec /usr/bin/time -f "rank $OMPI_COMM_WORLD_RANK peak RSS %M KiB" '"$TESSERA"' bench -m '"$MODEL"' --threads 1 \
    --expert-cache off '"$BENCH_ARGS" > "$OUT/a.json" 2> "$OUT/a.err" || { cat "$OUT/a.err" >&2; exit 1; }
  echo "A (2 ranks x 1 thread, experts split, resident): $(summary "$OUT/a.json"); cgroup peaks $(peak_of "$c0") / $(peak_of "$c1") MiB; $(grep -o 'rank [01] peak RSS [0-9]* KiB' "$OUT/a.err" | sort | tr '\n' ' ')"
  rmdir "$c0" "$c1"
}

run_b() {
  local c
  drop_caches
  c=$(make_cg single)
  sh -c 'echo $$ > '"$c"'/cgroup.procs && exec /usr/bin/time -f "peak RSS %M KiB" '"$TESSERA"' bench -m '"$MODEL"' \
    --threads 2 --expert-cache '"$CACHE $BENCH_ARGS" > "$OUT/b.json" 2> "$OUT/b.err" || { cat "$OUT/b.err" >&2; exit 1; }
  echo "B (1 process x 2 threads, streaming through $CACHE): $(summary "$OUT/b.json"); cgroup peak $(peak_of "$c") MiB; $(grep -o 'peak RSS [0-9]* KiB' "$OUT/b.err")"
  rmdir "$c"
}

for i in $(seq 1 "$PAIRS"); do
  echo "== pair $i"
  run_a
  run_b
done
