#!/usr/bin/env bash
# Installs the system packages Dispatch builds, runs and tests with, when they are missing.
# Debian/Ubuntu; uses sudo when not root. `make run` needs the build and run set; `make test`
# also installs what the tests drive for real (nginx with the echo module for the HTTP/2 client
# tests, Python's h2 for the fake APNs, openssl for test certificates).
set -euo pipefail

build=(libevent-dev libpq-dev libssl-dev libcurl4-openssl-dev curl)
tests=(nginx-light libnginx-mod-http-echo python3-h2 python3-cryptography python3-jwt openssl)
want=("${build[@]}")
[ "${1:-}" = "--tests" ] && want+=("${tests[@]}")

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${want[@]}"; do have_pkg "$p" || need+=("$p"); done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)

if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

command -v swift >/dev/null || [ -x /opt/swift/usr/bin/swift ] || {
  echo "Swift 6 is required (https://www.swift.org/install/linux/)" >&2
  exit 1
}
