#!/usr/bin/env bash
# Install the JDBC drivers `multimaster verify` (Spark) reads the sites with:
#   /usr/share/java/postgresql.jar          (org.postgresql.Driver)
#   /usr/share/java/mariadb-java-client.jar (org.mariadb.jdbc.Driver)
#   /usr/share/java/sqlite-jdbc.jar         (org.sqlite.JDBC, native lib from the -jni package)
# Idempotent: does nothing when all three jars are present. Needs root (or sudo) to install.
set -euo pipefail
JARS=(/usr/share/java/postgresql.jar /usr/share/java/mariadb-java-client.jar /usr/share/java/sqlite-jdbc.jar)
missing=0
for j in "${JARS[@]}"; do [ -e "$j" ] || missing=1; done
if [ "$missing" = 0 ]; then
  echo "JDBC jars already installed: ${JARS[*]}"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-jdbc.sh: run as root (or install sudo)" >&2; exit 1; fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq libpostgresql-jdbc-java libmariadb-java libxerial-sqlite-jdbc-java >/dev/null
for j in "${JARS[@]}"; do
  [ -e "$j" ] || { echo "install-jdbc.sh: $j still missing after install" >&2; exit 1; }
done
echo "JDBC jars installed: ${JARS[*]}"
