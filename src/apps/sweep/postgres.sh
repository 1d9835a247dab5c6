#!/usr/bin/env bash
# PostgreSQL for sweeps across machines (README.md beside this script): Debian's server, installed when missing, and
# throwaway clusters on 127.0.0.1 (src/apps/sweep/test_sweep_postgres.py starts one per run; so can you, to try
# the multi-machine recipe on one machine).
#
#   src/apps/sweep/postgres.sh install          apt-get install -y postgresql, unless a server is installed
#   src/apps/sweep/postgres.sh start DIR PORT   a new cluster in DIR (new or empty) on 127.0.0.1:PORT, with the
#                                        user sweep and the database sweeps; prints the URL for --storage:
#                                        postgresql://sweep:PASSWORD@127.0.0.1:PORT/sweeps
#   src/apps/sweep/postgres.sh stop DIR         stops the cluster in DIR; then delete DIR
#
# PASSWORD is $PGPASSWORD, else "sweep". The server refuses to run as root: run as root, this script runs
# it as the user postgres that Debian's package creates. Exit status 3: no server is installed.
set -euo pipefail

die() {
    echo "error: $1" >&2
    exit "${2:-1}"
}

# the folder of initdb and pg_ctl: Debian keeps them off PATH, in /usr/lib/postgresql/<version>/bin
bin_dir() {
    local newest
    newest=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
    if [[ -n $newest && -x $newest/pg_ctl ]]; then
        echo "$newest"
    elif command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(command -v pg_ctl)"
    else
        return 1
    fi
}

# runs a server program as a user the server accepts: this one, or postgres when this one is root
as_owner() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

install() {
    if bin_dir >/dev/null; then
        echo "PostgreSQL's server is installed in $(bin_dir)."
        return
    fi
    local sudo=()
    [[ $EUID -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
    echo "PostgreSQL's server is installed in $(bin_dir)."
}

start() {
    local dir=${1:?start needs a folder and a port} port=${2:?start needs a folder and a port}
    local bin password=${PGPASSWORD:-sweep}
    bin=$(bin_dir) || die "PostgreSQL's server is not installed; install it: make postgres" 3
    [[ $port =~ ^[0-9]+$ ]] || die "the port must be a number, got '$port'"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ -z $(ls -A "$dir") ]] || die "$dir is not empty; name a new folder for the cluster"
    if [[ $EUID -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || die "the server refuses to run as root, and there is no user postgres to run it as"
        chown postgres: "$dir"
    fi
    as_owner test -w "$dir" || die "the user postgres cannot write $dir (a folder above it is closed to it); name a folder under /tmp"
    # the password reaches initdb in a file of the cluster's owner, deleted once read
    as_owner bash -c 'umask 077 && cat > "$1"' _ "$dir/password" <<<"$password"
    as_owner "$bin/initdb" --pgdata="$dir/data" --username=sweep --pwfile="$dir/password" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --no-sync >"$dir/initdb.log" ||
        die "initdb failed; its output is in $dir/initdb.log"
    rm -f "$dir/password"
    # 127.0.0.1 only, its socket in DIR (not /var/run/postgresql, another server's); no fsync: a
    # throwaway cluster needs no durability, and the disk is shared
    as_owner "$bin/pg_ctl" --pgdata="$dir/data" --log="$dir/server.log" --wait --silent \
        --options="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off" \
        start || die "the server did not start; its log is $dir/server.log"
    as_owner "$bin/createdb" --host="$dir" --port="$port" --username=sweep sweeps
    echo "postgresql://sweep:$password@127.0.0.1:$port/sweeps"
}

stop() {
    local dir=${1:?stop needs the folder of the cluster} bin
    bin=$(bin_dir) || die "PostgreSQL's server is not installed" 3
    as_owner "$bin/pg_ctl" --pgdata="$dir/data" --mode=fast --wait --silent stop
}

case ${1:-} in
install) install ;;
start) start "${@:2}" ;;
stop) stop "${@:2}" ;;
*) die "usage: src/apps/sweep/postgres.sh install | start DIR PORT | stop DIR" 2 ;;
esac
