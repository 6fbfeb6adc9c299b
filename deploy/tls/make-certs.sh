#!/bin/sh
# Makes, with openssl, the certificates deploy/overlays/tls-manual needs (clusters without
# cert-manager): a private CA, the agents' server certificate, the console's and a machine
# viewer's client certificates, and one operator certificate per person named.
#
#   deploy/tls/make-certs.sh DIR [PERSON...]  # writes DIR/{ca,agent,console,viewer}.{crt,key} and DIR/PERSON.{crt,key}
#   kubectl create namespace blockjanitor   # if deploy/base is not applied yet
#   kubectl -n blockjanitor create secret generic blockjanitor-agent-tls \
#     --from-file=tls.crt=DIR/agent.crt --from-file=tls.key=DIR/agent.key --from-file=ca.crt=DIR/ca.crt
#   kubectl apply -k deploy/overlays/tls-manual
#
# Identities (the agent's roles come from a client certificate's DNS SANs or CN, see
# deploy/components/tls/tls.toml):
#   agent.crt    server; DNS agent.blockjanitor.svc and localhost, IP 127.0.0.1
#                (agentctl --server-name agent.blockjanitor.svc when connecting to a pod IP)
#   console.crt  client; console.blockjanitor.svc: the console role (tcp.consoles)
#   viewer.crt   client; viewer.blockjanitor.svc: viewer (a machine reader, e.g. a dashboard)
#   PERSON.crt   client; CN=PERSON, no SAN: that person's identity, an operator once tcp.operators
#                lists it (one certificate per person, never one a team shares: the audit names it;
#                give each person their own key, and nobody else)
# Keys are ECDSA P-256; the CA lives 10 years, the others 1 year (DAYS=N to change). An existing
# CA in DIR is reused, so re-running renews the leaf certificates under the same CA. Keys are
# written mode 0600. Needs openssl 1.1.1 or later.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 DIR [PERSON...]" >&2; exit 1; }
dir=$1
shift
days=${DAYS:-365}
mkdir -p "$dir"
umask 077

if [ ! -s "$dir/ca.key" ] || [ ! -s "$dir/ca.crt" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -sha256 -days 3650 -subj "/CN=blockjanitor-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.crt"
fi

# leaf NAME CN EXTENDED_USAGE SUBJECT_ALT_NAMES
leaf() {
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$1.key"
  openssl req -new -key "$dir/$1.key" -subj "/CN=$2" -out "$dir/$1.csr"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$3" "$4" >"$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -sha256 -days "$days" -extfile "$dir/$1.ext" -out "$dir/$1.crt" 2>/dev/null
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}

leaf agent agent.blockjanitor.svc serverAuth "DNS:agent.blockjanitor.svc,DNS:localhost,IP:127.0.0.1"
leaf console console.blockjanitor.svc clientAuth "DNS:console.blockjanitor.svc"
leaf viewer viewer.blockjanitor.svc clientAuth "DNS:viewer.blockjanitor.svc"

# person NAME: a client certificate whose only identity is its CN.
person() {
  case $1 in
    ''|*[!A-Za-z0-9._@-]*|ca|agent|console|viewer) echo "$0: '$1' is not a person's name here (letters, digits, . _ @ -)" >&2; exit 1 ;;
  esac
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$1.key"
  openssl req -new -key "$dir/$1.key" -subj "/CN=$1" -out "$dir/$1.csr"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' >"$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -sha256 -days "$days" -extfile "$dir/$1.ext" -out "$dir/$1.crt" 2>/dev/null
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}
people=
for p in "$@"; do
  person "$p"
  people="$people $p.crt/key"
done
chmod 0644 "$dir"/*.crt
echo "certificates in $dir: ca.crt agent.crt/key console.crt/key viewer.crt/key$people"
