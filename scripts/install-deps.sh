#!/usr/bin/env bash
# Installs the system packages Dispatch builds, runs and tests with, when they are missing.
# Debian/Ubuntu; uses sudo when not root. `make run` needs the build and run set; `make test`
# (`--tests`) also installs what the tests drive for real: nginx with the echo module (HTTP/2
# client tests), Python's h2 (the fake APNs), openssl (test certificates), Chromium and its
# WebDriver (the browser tests), and a Python venv in .build/pyenv with
# Tests/tools/requirements.txt (Selenium, schemathesis).
set -euo pipefail

build=(libevent-dev libh2o-evloop-dev libpq-dev libssl-dev libcurl4-openssl-dev libnghttp2-dev curl libnats-dev)
tests=(nats-server prometheus nginx-light libnginx-mod-http-echo python3-h2 python3-cryptography python3-jwt openssl
       chromium chromium-driver python3-venv nodejs systemd)
want=("${build[@]}")
with_tests=0
[ "${1:-}" = "--tests" ] && { want+=("${tests[@]}"); with_tests=1; }

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

# The test tools' Python packages, pinned; reinstalled only when the requirements change.
req=Tests/tools/requirements.txt
venv=.build/pyenv
if [ "$with_tests" = 1 ] && [ -f "$req" ] && ! cmp -s "$req" "$venv/.installed" 2>/dev/null; then
  echo "installing test tools into $venv: $(grep -v '^#' "$req" | tr '\n' ' ')"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  cp "$req" "$venv/.installed"
fi
