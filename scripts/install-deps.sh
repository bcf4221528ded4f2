#!/usr/bin/env bash
# Installs the system packages Dispatch builds and runs with, when they are missing:
# libevent and libpq headers, the PostgreSQL server (for the embedded default and tests),
# curl; for the browser and API tests, Chromium + its WebDriver and python3-venv, then a
# Python venv in .build/pyenv with Tests/tools/requirements.txt (Selenium, schemathesis).
# Debian/Ubuntu; uses sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in libevent-dev libpq-dev curl chromium chromium-driver python3-venv; do have_pkg "$p" || need+=("$p"); done
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
if [ -f "$req" ] && ! cmp -s "$req" "$venv/.installed" 2>/dev/null; then
  echo "installing test tools into $venv: $(grep -v '^#' "$req" | tr '\n' ' ')"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  cp "$req" "$venv/.installed"
fi
