#!/usr/bin/env bash
# Ends a cluster that scripts/ceph-up.sh started in DIR — its daemons by the PIDs it wrote,
# with SIGKILL: the cluster is thrown away (a memstore OSD told to stop waits on the monitor
# to mark it down) — and removes DIR.
#
#   scripts/ceph-down.sh DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
[ -d "$dir" ] || exit 0
running() {  # alive and not a zombie (the daemons outlive the shell that started them)
  [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}
pids=()
for f in "$dir/osd.pid" "$dir/mon.pid"; do
  [ -f "$f" ] && pids+=("$(cat "$f")")
done
for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
for _ in $(seq 1 50); do
  alive=0
  for p in "${pids[@]}"; do running "$p" && alive=1; done
  [ $alive -eq 0 ] && break
  sleep 0.1
done
rm -rf "$dir"
