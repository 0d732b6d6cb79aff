#!/bin/sh
# Join the given Redis nodes (host names, port 6379) into one cluster of primaries, once.
# redis-cli --cluster create wants addresses, so each name is resolved first.
set -eu
first="$1"
if redis-cli -h "$first" cluster info | grep -q '^cluster_state:ok'; then
    echo "redis cluster already formed"
    exit 0
fi
addresses=""
for node in "$@"; do
    ip=$(getent hosts "$node" | awk '{ print $1; exit }')
    addresses="$addresses $ip:6379"
done
# shellcheck disable=SC2086 # one argument per address
redis-cli --cluster create $addresses --cluster-replicas 0 --cluster-yes
until redis-cli -h "$first" cluster info | grep -q '^cluster_state:ok'; do
    sleep 1
done
echo "redis cluster formed:$addresses"
