#!/usr/bin/env bash
# Installs the system packages Dispatch builds, runs and tests with, when they are missing.
# Debian/Ubuntu; uses sudo when not root. `make run` needs the build and run set; `make test`
# (`--tests`) also installs what the tests drive for real: nginx with the echo module (HTTP/2
# client tests), Python's h2 (the fake APNs), openssl (test certificates), Chromium and its
# WebDriver (the browser tests), and a Python venv in .build/pyenv with
# Tests/tools/requirements.txt (Selenium, schemathesis).
set -euo pipefail

build=(libevent-dev libh2o-evloop-dev libpq-dev libssl-dev libcurl4-openssl-dev curl libnats-dev)
tests=(nats-server prometheus nginx-light libnginx-mod-http-echo python3-h2 python3-cryptography python3-jwt openssl
       chromium chromium-driver python3-venv nodejs systemd)
want=("${build[@]}")
with_tests=0
[ "${1:-}" = "--tests" ] && { want+=("${tests[@]}"); with_tests=1; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# libcurl 8.14 from bookworm-backports (bookworm ships 7.88): it retries a request whose
# connection died on a fresh one by itself, and from 8.10 curl_easy_upkeep reaches a multi
# handle's connections (its HTTP/2 PING still waits in the send buffer of an idle connection,
# so the server closes idle APNs connections with either; see CurlClient.canPingIdleConnections).
# Tolerant: when backports cannot be reached, 7.88 stays and everything works the same.
backports_uri=${DISPATCH_BACKPORTS_URI:-http://deb.debian.org/debian}
curl_from_backports() {
  local codename="" have list=/etc/apt/sources.list.d/dispatch-bookworm-backports.sources
  [ -r /etc/os-release ] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ "$codename" = bookworm ] || return 0
  have=$(dpkg-query -W -f='${Version}' libcurl4-openssl-dev 2>/dev/null || true)
  if [ -n "$have" ] && dpkg --compare-versions "$have" ge 8.10; then return 0; fi
  if ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "adding bookworm-backports (libcurl 8.14) as $list"
    printf '%s\n' "# Added by Dispatch's scripts/install-deps.sh: libcurl >= 8.10 from backports." \
      "Types: deb" "URIs: $backports_uri" "Suites: bookworm-backports" "Components: main" \
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | $sudo tee "$list" >/dev/null
  fi
  # apt-get update succeeds while a source is unreachable; the candidate tells.
  $sudo apt-get update -qq || true
  local offered
  offered=$(apt-cache madison libcurl4-openssl-dev 2>/dev/null || true)
  if [[ "$offered" != *bookworm-backports* ]]; then
    echo "warning: bookworm-backports cannot be reached; keeping libcurl ${have:-from bookworm}" >&2
    # An unreachable source we added would only slow every later apt-get update.
    [ -f "$list" ] && $sudo rm -f "$list" && { $sudo apt-get update -qq || true; }
    return 0
  fi
  echo "installing libcurl from bookworm-backports"
  # Only curl's packages come from backports (curl the tool pins libcurl4's exact version).
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    libcurl4-openssl-dev/bookworm-backports libcurl4/bookworm-backports curl/bookworm-backports \
    || echo "warning: libcurl from bookworm-backports did not install; keeping libcurl ${have:-from bookworm}" >&2
}
curl_from_backports

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${want[@]}"; do have_pkg "$p" || need+=("$p"); done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)

if ((${#need[@]})); then
  echo "installing: ${need[*]}"
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
