#!/bin/sh
# Test fixture: a throw-away federation PKI made with the openssl CLI (tests only; product code
# uses security/pki). Usage: gen_certs.sh DIR. Writes into DIR:
#   ca.pem                 federation CA
#   server.{pem,key}       cluster dc-a, SAN IP:127.0.0.1 + DNS:localhost + URI nebula://cluster/dc-a
#   client.{pem,key}       cluster dc-b (URI nebula://cluster/dc-b)
#   wrong.{pem,key}        cluster dc-x: valid, but not the cluster a job expects
#   user.{pem,key}         user alice (URI nebula://user/alice)
#   other-ca.pem, foreign.{pem,key}  a second CA and a "dc-b" certificate it issued
#   cnonly.{pem,key}       signed by ca, CN=alice and no subjectAltName: no nebula identity
set -eu
d=$1
mkdir -p "$d"
cd "$d"
umask 077

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

mkca() { # name cn
  newkey "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 2 -subj "/O=nebula test/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem" 2>/dev/null
}

issue() { # name ca cn [san]
  newkey "$1.key"
  openssl req -new -key "$1.key" -subj "/O=nebula test/CN=$3" -out "$1.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyAgreement" \
    "extendedKeyUsage=serverAuth,clientAuth" > "$1.ext"
  [ -z "${4:-}" ] || printf '%s\n' "subjectAltName=$4" >> "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -sha256 -days 2 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

mkca ca "nebula test federation CA"
mkca other-ca "some other CA"
issue server ca dc-a "IP:127.0.0.1,DNS:localhost,URI:nebula://cluster/dc-a"
issue client ca dc-b "IP:127.0.0.1,URI:nebula://cluster/dc-b"
issue wrong ca dc-x "URI:nebula://cluster/dc-x"
issue user ca alice "URI:nebula://user/alice"
issue foreign other-ca dc-b "IP:127.0.0.1,URI:nebula://cluster/dc-b"
issue cnonly ca alice
rm -f ./*.srl
