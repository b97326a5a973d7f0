#!/usr/bin/env bash
# Sets up the Shakespeare app (study S1's dynamic workload) on Debian 12, as root:
#   1. installs php-fpm, php-mysql and mariadb-server if missing;
#   2. starts MariaDB and PHP-FPM as plain daemons (no systemd on the project's machines);
#   3. creates the database and the app's read-only user;
#   4. installs the data packages into a venv under the cache dir and runs load.py, which
#      reloads only when the data, the fact table or the loader changed;
#   5. writes the benchmark pool (pm static, the same for every web server) and checks that
#      both of its listeners answer a real request for the app.
# Idempotent: run it as often as you like; a second run on a warm machine takes seconds.
#
# Settings (environment):
#   SHAKESPEARE_FPM_CHILDREN  children of each pool (default 100, as study S1)
#   SHAKESPEARE_FPM_SOCKET    unix listener (default /run/php/shakespeare.sock)
#   SHAKESPEARE_FPM_TCP       TCP listener (default 127.0.0.1:9000, PHP-FPM's usual port)
#   SHAKESPEARE_DOCROOT       where public/ is copied, the web servers' root (default /var/www/shakespeare)
#   SHAKESPEARE_CACHE         the loader's venv (default /var/cache/shakespeare)
set -euo pipefail

APP_DIR="$(cd "$(dirname "$0")" && pwd)"
DOCROOT="${SHAKESPEARE_DOCROOT:-/var/www/shakespeare}"
PHP_VERSION=8.2
FPM_BIN="/usr/sbin/php-fpm$PHP_VERSION"
FPM_CONF="/etc/php/$PHP_VERSION/fpm/php-fpm.conf"
FPM_PID="/run/php/php$PHP_VERSION-fpm.pid"
FPM_LOG="/var/log/php$PHP_VERSION-fpm.log"
PHP_LOG=/var/log/shakespeare-php.log # the app's PHP errors (written by the www-data children)
POOL_FILE="/etc/php/$PHP_VERSION/fpm/pool.d/shakespeare.conf"
FPM_CHILDREN="${SHAKESPEARE_FPM_CHILDREN:-100}"
FPM_SOCKET="${SHAKESPEARE_FPM_SOCKET:-/run/php/shakespeare.sock}"
FPM_TCP="${SHAKESPEARE_FPM_TCP:-127.0.0.1:9000}"
CACHE_DIR="${SHAKESPEARE_CACHE:-/var/cache/shakespeare}"
VENV="$CACHE_DIR/venv"
DB_SOCKET=/run/mysqld/mysqld.sock
DB_CNF=/etc/mysql/mariadb.conf.d/60-shakespeare.cnf
DB_LOG=/var/log/mysql/error.log
# The app's credentials. Not a secret: a read-only account on a local benchmark database that
# listens on 127.0.0.1 and the unix socket only. index.php has the same defaults.
DB_NAME=shakespeare
DB_USER=shakespeare
DB_PASSWORD=shakespeare-s1

log() { printf '[shakespeare] %s\n' "$*"; }
die() { printf '[shakespeare] error: %s\n' "$*" >&2; exit 1; }

# poll SECONDS MESSAGE COMMAND...: run COMMAND until it succeeds, then log MESSAGE; fail
# (return 1) after SECONDS.
poll() {
  local what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1 # polling interval, not a synchronisation
  done
  log "$what"
}

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts services)"
[ -r /etc/debian_version ] || die "written for Debian 12 (apt, php$PHP_VERSION-fpm, MariaDB 10.11)"
case "$FPM_CHILDREN" in '' | *[!0-9]*) die "SHAKESPEARE_FPM_CHILDREN must be a number" ;; esac

# --- 1. packages -------------------------------------------------------------------------
missing=()
for p in php-fpm php-mysql mariadb-server; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's policy-rc.d may refuse to start the services here; setup starts them below.
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x "$FPM_BIN" ] || die "$FPM_BIN not found: this setup expects Debian 12's PHP $PHP_VERSION"

# --- 2. MariaDB --------------------------------------------------------------------------
# Two pools of persistent connections need up to 2 x children connections, plus the loader
# and a margin; MariaDB's default is 151.
max_conn=$((2 * FPM_CHILDREN + 50))
db_cnf="# Written by gannet's apps/shakespeare/setup.sh.
[mysqld]
# Both PHP-FPM pools keep one persistent connection per child.
max_connections = $max_conn
# Connections come from localhost only; skip reverse DNS on each.
skip-name-resolve"
if [ "$(cat "$DB_CNF" 2>/dev/null)" != "$db_cnf" ]; then
  printf '%s\n' "$db_cnf" >"$DB_CNF"
fi

db_up() { mariadb-admin --socket="$DB_SOCKET" ping; }
if ! db_up >/dev/null 2>&1; then
  log "starting MariaDB"
  install -d -o mysql -g root -m 755 /run/mysqld
  install -d -o mysql -g adm -m 2750 /var/log/mysql
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  # mysqld_safe restarts mariadbd if it dies; setsid detaches it from this shell. Debian's
  # [mysqld_safe] section asks for syslog, which nothing reads on these machines.
  setsid -f mysqld_safe --skip-syslog --log-error="$DB_LOG" </dev/null >/dev/null 2>&1
  poll 60 "MariaDB is up" db_up || { tail -n 20 "$DB_LOG" >&2 || true; die "MariaDB did not answer within 60 s (log: $DB_LOG)"; }
fi
# Apply the settings to a server that was already running, too.
mariadb --socket="$DB_SOCKET" -e "SET GLOBAL max_connections = GREATEST(@@max_connections, $max_conn)"

mariadb --socket="$DB_SOCKET" <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
-- the web app only reads
GRANT SELECT ON \`$DB_NAME\`.* TO '$DB_USER'@'localhost';
SQL

# --- 3. data packages and the loader ----------------------------------------------------
req="$APP_DIR/requirements.txt"
stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE_DIR"
  python3 -m venv "$VENV" || die "python3 -m venv failed (Debian's python3 needs python3-venv)"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
  echo "$want" >"$stamp"
fi
# The loader runs as root over the unix socket (MariaDB's unix_socket authentication).
"$VENV/bin/python" "$APP_DIR/load.py" --if-changed --socket "$DB_SOCKET" --database "$DB_NAME"

# --- 4. PHP-FPM --------------------------------------------------------------------------
# The document root is a copy of public/ at a fixed path: the same for every clone of the
# repository (the arena's configs name it), and readable by PHP-FPM's children (www-data)
# and the web servers' workers wherever the clone lives.
docroot_changed=0
if ! diff -rq "$APP_DIR/public" "$DOCROOT" >/dev/null 2>&1; then
  log "copying public/ to $DOCROOT"
  rm -rf "$DOCROOT.new"
  cp -r "$APP_DIR/public" "$DOCROOT.new"
  chmod -R u=rwX,go=rX "$DOCROOT.new"
  rm -rf "$DOCROOT"
  mv "$DOCROOT.new" "$DOCROOT"
  docroot_changed=1
fi

pool() { # NAME LISTEN EXTRA
  cat <<EOF
[$1]
user = www-data
group = www-data
listen = $2
listen.backlog = 4096
$3
; A fixed number of children (study S1: pm static, 100), so every web server meets the same
; pool and no time goes into spawning children during a run.
pm = static
pm.max_children = $FPM_CHILDREN
pm.max_requests = 0
request_terminate_timeout = 60s
catch_workers_output = yes
security.limit_extensions = .php
; The app reads its database settings from these (index.php has the same defaults).
env[SHAKESPEARE_DB_SOCKET] = $DB_SOCKET
env[SHAKESPEARE_DB_NAME] = $DB_NAME
env[SHAKESPEARE_DB_USER] = $DB_USER
env[SHAKESPEARE_DB_PASSWORD] = $DB_PASSWORD
; PHP's errors go to a file, not to the web server as FastCGI stderr: every web server then
; sees the same answers, and a benchmark run never logs through the server under test.
php_admin_flag[display_errors] = off
php_admin_flag[log_errors] = on
php_admin_value[error_log] = $PHP_LOG
php_admin_value[memory_limit] = 64M

EOF
}
pool_conf="; Written by gannet's apps/shakespeare/setup.sh; edit that script, not this file.
; Two pools with the same settings, one per listener (a pool has a single listen address):
; web servers that speak FastCGI over unix sockets use the first, the others the second.

$(pool shakespeare "$FPM_SOCKET" "; any local user may connect: web servers run as different users
listen.owner = www-data
listen.group = www-data
listen.mode = 0666")

$(pool shakespeare-tcp "$FPM_TCP" "listen.allowed_clients = 127.0.0.1")"

pool_changed=0
if [ "$(cat "$POOL_FILE" 2>/dev/null)" != "$pool_conf" ]; then
  printf '%s\n' "$pool_conf" >"$POOL_FILE"
  pool_changed=1
fi
"$FPM_BIN" -t --fpm-config "$FPM_CONF" >/dev/null 2>&1 || {
  "$FPM_BIN" -t --fpm-config "$FPM_CONF" >&2 || true
  die "PHP-FPM rejects its configuration"
}

touch "$PHP_LOG" && chown www-data:adm "$PHP_LOG" && chmod 640 "$PHP_LOG"

fpm_running() { [ -s "$FPM_PID" ] && kill -0 "$(cat "$FPM_PID")" 2>/dev/null; }
install -d -o www-data -g www-data /run/php
if fpm_running && { [ "$pool_changed" = 1 ] || [ "$docroot_changed" = 1 ]; }; then
  # A full stop and start rather than a reload (USR2): once the old master is gone no child
  # with the old settings, or OPcache's copy of the old code, can answer the checks below.
  log "restarting PHP-FPM for the new pool settings or PHP code"
  kill -QUIT "$(cat "$FPM_PID")" # graceful: requests in progress finish
  poll 30 "PHP-FPM stopped" sh -c "! kill -0 $(cat "$FPM_PID")" || die "PHP-FPM did not stop within 30 s"
fi
if ! fpm_running; then
  log "starting PHP-FPM ($FPM_CHILDREN children per pool)"
  # With --daemonize the command returns once the master has bound its listeners (or failed).
  "$FPM_BIN" --daemonize --fpm-config "$FPM_CONF" || {
    tail -n 20 "$FPM_LOG" >&2 || true
    die "PHP-FPM did not start (is $FPM_TCP or $FPM_SOCKET taken? log: $FPM_LOG)"
  }
fi

# Poll each listener with a real request for the app's front page until it answers 200:
# this proves PHP, the pool, PDO and the loaded data together.
fcgi_ok() { "$VENV/bin/python" "$APP_DIR/fcgi.py" -q --timeout 5 --docroot "$DOCROOT" "$1" /.json; }
for addr in "unix:$FPM_SOCKET" "$FPM_TCP"; do
  poll 30 "PHP-FPM answers on $addr" fcgi_ok "$addr" || {
    "$VENV/bin/python" "$APP_DIR/fcgi.py" --docroot "$DOCROOT" "$addr" /.json >&2 || true
    tail -n 20 "$FPM_LOG" >&2 || true
    die "PHP-FPM on $addr did not answer /.json with 200 within 30 s (log: $FPM_LOG)"
  }
done

cat <<EOF
[shakespeare] ready.
  document root   $DOCROOT
  PHP-FPM         unix:$FPM_SOCKET  or  $FPM_TCP  (pm static, $FPM_CHILDREN children each)
  MariaDB         database $DB_NAME, user $DB_USER, socket $DB_SOCKET
  nginx (or gannet) server block:
      root $DOCROOT;
      index index.php;
      location / { try_files \$uri \$uri/ /index.php?\$args; }
      location ~ \.php\$ {
          include fastcgi_params;
          fastcgi_param SCRIPT_FILENAME \$document_root\$fastcgi_script_name;
          fastcgi_pass unix:$FPM_SOCKET;
      }
EOF
