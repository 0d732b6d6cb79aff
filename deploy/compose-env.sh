#!/bin/sh
# Write the secrets docker-compose.yml requires into .env beside it (owner-only), each generated once:
# a variable already in .env, or set in the environment, is kept. Usage: deploy/compose-env.sh [ENV_FILE]
set -eu
cd "$(dirname "$0")/.."
file="${1:-.env}"
umask 077
touch "$file"
chmod 600 "$file"
random_hex() {  # letters and digits only: the passwords go into URLs
    od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'
}
for name in MEMENTO_AUTH_SECRET REDIS_PASSWORD FALKORDB_PASSWORD POSTGRES_PASSWORD GRAFANA_ADMIN_PASSWORD; do
    if grep -q "^$name=" "$file"; then
        continue
    fi
    value=$(printenv "$name" || true)
    if [ -z "$value" ]; then
        value=$(random_hex 24)
        echo "compose-env: generated $name into $file" >&2
    fi
    echo "$name=$value" >> "$file"
done
