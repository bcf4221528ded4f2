#!/bin/sh
# Creates test TLS and APNs keys for fake_apns.py in OUTDIR (see README.md):
#   ca.pem, ca-key.pem                 self-signed test CA (EC P-256)
#   server.pem, server-key.pem         server cert for localhost and 127.0.0.1, signed by the CA
#   AuthKey_TESTKEY123.p8              APNs auth key like Apple's: PKCS#8 PEM, EC P-256
#   AuthKey_TESTKEY123.pub.pem         its public key
# Idempotent: does nothing when every file is already there.
set -eu

OUT=${1:?usage: make_test_pki.sh OUTDIR}
KEY_ID=TESTKEY123
FILES="ca.pem ca-key.pem server.pem server-key.pem AuthKey_$KEY_ID.p8 AuthKey_$KEY_ID.pub.pem"

mkdir -p "$OUT"
if command -v flock >/dev/null 2>&1; then  # parallel test runs: one generates, the rest wait
    exec 9>"$OUT/.make_test_pki.lock"
    flock 9
fi

complete=yes
for f in $FILES; do [ -s "$OUT/$f" ] || complete=no; done
[ "$complete" = yes ] && exit 0

TMP=$(mktemp -d "$OUT/.pki.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca-key.pem -out ca.pem -days 3650 -subj "/CN=Dispatch Test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout server-key.pem -out server.csr -subj "/CN=localhost" 2>/dev/null
cat > server.ext <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem \
    -set_serial "0x$(openssl rand -hex 8)" -days 825 -extfile server.ext \
    -out server.pem 2>/dev/null

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "AuthKey_$KEY_ID.p8"
openssl pkey -in "AuthKey_$KEY_ID.p8" -pubout -out "AuthKey_$KEY_ID.pub.pem"

chmod 600 ca-key.pem server-key.pem "AuthKey_$KEY_ID.p8"
for f in $FILES; do mv -f "$f" "$OUT/$f"; done
