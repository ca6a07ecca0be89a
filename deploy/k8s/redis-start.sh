#!/bin/sh
# Starts redis-server with the users of $1 (redis-users.conf), each ${NAME} in it replaced
# by that environment variable; the remaining arguments go to redis-server. The resolved
# file lives in $TMPDIR (/tmp: memory in the pod, a tmpfs in compose), readable by Redis only.
set -eu
users=$1
shift
conf=${TMPDIR:-/tmp}/redis.conf
umask 077
cp "$users" "$conf"
for name in REDIS_PASSWORD REDIS_GATEWAY_PASSWORD REDIS_SUPERVISOR_PASSWORD \
            REDIS_CONTROLLER_PASSWORD; do
    eval "value=\${$name:-}"
    case $value in
        '' | *[!A-Za-z0-9_-]*)
            echo "redis-start: set $name (letters, digits, - and _: openssl rand -hex 32)" >&2
            exit 1 ;;
    esac
    sed -i "s/\${$name}/$value/g" "$conf"
done
if grep -n '^[^#]*\${' "$conf" >&2; then
    echo "redis-start: $users names a variable this script does not set" >&2
    exit 1
fi
exec redis-server "$conf" "$@"
