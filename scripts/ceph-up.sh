#!/usr/bin/env bash
# Brings up a single-host Ceph cluster in DIR for tests, the demo and benchmarks: one monitor
# and one memstore OSD on loopback, cephx on, its own conf, fsid and free ports, no systemd.
# Ready when a write to the pool succeeds (health can say OK before the OSD takes I/O).
#
#   scripts/ceph-up.sh DIR [POOL]      # POOL defaults to "kvcache"
#   export CEPH_CONF=DIR/ceph.conf     # then `rados -p POOL ls`, or kvcached --ceph-conf
#   scripts/ceph-down.sh DIR           # ends the daemons by PID and removes DIR
#
# Prints the conf's path, the pool and the seconds it took. The daemons' logs are in DIR/log.
# Needs ceph-mon, ceph-osd and ceph-common (scripts/install-deps.sh).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [POOL]" >&2; exit 2; }
dir=$(mkdir -p "$1" && cd "$1" && pwd)
pool=${2:-kvcache}
start=$SECONDS
for tool in ceph-mon ceph-osd ceph ceph-authtool monmaptool rados; do
  command -v "$tool" >/dev/null ||
    { echo "ceph-up: $tool is missing (scripts/install-deps.sh installs Ceph)" >&2; exit 1; }
done
if [ -e "$dir/ceph.conf" ]; then
  echo "ceph-up: $dir already holds a cluster (scripts/ceph-down.sh $dir first)" >&2
  exit 1
fi
mkdir -p "$dir/run" "$dir/log" "$dir/mon/ceph-a" "$dir/osd/ceph-0"

# A free port for the monitor (the OSD binds its own from the range below).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
mon_port=$(free_port)
fsid=$(/usr/bin/python3 -c 'import uuid; print(uuid.uuid4())')
osd_uuid=$(/usr/bin/python3 -c 'import uuid; print(uuid.uuid4())')
conf="$dir/ceph.conf"
# Each daemon names its own keyring: one keyring line in [global] breaks the daemons' auth.
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$mon_port]
mon initial members = a
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
ms bind port min = $((mon_port + 1))
ms bind port max = $((mon_port + 200))
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
paxos propose interval = 0.1
[mon.a]
mon data = $dir/mon/ceph-a
keyring = $dir/mon/keyring
[osd.0]
osd data = $dir/osd/ceph-0
osd objectstore = memstore
memstore device bytes = ${KVC_CEPH_OSD_BYTES:-2147483648}
keyring = $dir/osd/ceph-0/keyring
[client.admin]
keyring = $dir/client.admin.keyring
EOF

ceph-authtool --create-keyring "$dir/mon/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$dir/client.admin.keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool --create-keyring "$dir/osd/ceph-0/keyring" --gen-key -n osd.0 \
  --cap mon 'allow profile osd' --cap osd 'allow *' >/dev/null
ceph-authtool "$dir/mon/keyring" --import-keyring "$dir/client.admin.keyring" >/dev/null
ceph-authtool "$dir/mon/keyring" --import-keyring "$dir/osd/ceph-0/keyring" >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon/keyring" \
  >"$dir/log/mkfs-mon.log" 2>&1

ceph-mon -c "$conf" -i a -f >>"$dir/log/mon.a.stdout" 2>&1 &
echo $! >"$dir/mon.pid"
c=(ceph -c "$conf" --connect-timeout 5)
for _ in $(seq 1 100); do
  "${c[@]}" mon stat >/dev/null 2>&1 && break
  sleep 0.1
done
"${c[@]}" osd new "$osd_uuid" 0 >/dev/null
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/mkfs-osd.log" 2>&1
ceph-osd -c "$conf" -i 0 -f >>"$dir/log/osd.0.stdout" 2>&1 &
echo $! >"$dir/osd.pid"
"${c[@]}" osd pool create "$pool" 8 8 >/dev/null 2>&1
"${c[@]}" osd pool application enable "$pool" kvcache >/dev/null 2>&1 || true
# Ready: a write goes through (the OSD up, its PGs active).
echo ready >"$dir/probe"
for _ in $(seq 1 300); do
  if timeout 5 rados -c "$conf" -p "$pool" put ceph-up-probe "$dir/probe" 2>/dev/null; then
    rados -c "$conf" -p "$pool" rm ceph-up-probe >/dev/null 2>&1 || true
    echo "ceph-up: $conf (pool $pool) ready in $((SECONDS - start)) s"
    exit 0
  fi
  sleep 0.1
done
echo "ceph-up: no write succeeded within 30 s; logs in $dir/log" >&2
exit 1
