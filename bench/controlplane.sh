#!/usr/bin/env bash
# Starts etcd + kube-apiserver with the flags of vmop's test harness
# (tests/src/controlplane/{etcd,apiserver}.rs), on loopback, in directory $1 (created), from the
# control-plane binaries in $VMOP_CONTROLPLANE_BIN (exported by `eval "$(scripts/prepare.sh)"`).
# Certificates come from openssl (the harness uses rcgen; both ECDSA P-256). Writes
# $1/admin.kubeconfig, $1/etcd.pid and $1/apiserver.pid, and returns once /readyz answers.
# Stop: kill "$(cat $1/apiserver.pid)" "$(cat $1/etcd.pid)".
set -euo pipefail
dir=${1:?usage: controlplane.sh DIR}
bin=${VMOP_CONTROLPLANE_BIN:?run eval "$(scripts/prepare.sh)" first: it builds the control plane and exports its location}
mkdir -p "$dir/pki"
cd "$dir/pki"

key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
sign() { # NAME SUBJECT EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3 \
    -extfile <(printf '%s\n' "$3") -out "$1.crt" 2>/dev/null
}
key ca.key
openssl req -x509 -new -key ca.key -subj /CN=vmop-bench-ca -days 3 -out ca.crt \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature
sign serving /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
sign admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
key sa.key
openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
cd "$dir"

read -r p1 p2 p3 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')

"$bin/etcd" --name=default --data-dir="$dir/etcd-data" \
  --listen-client-urls=http://127.0.0.1:$p1 --advertise-client-urls=http://127.0.0.1:$p1 \
  --listen-peer-urls=http://127.0.0.1:$p2 --initial-advertise-peer-urls=http://127.0.0.1:$p2 \
  --initial-cluster=default=http://127.0.0.1:$p2 --unsafe-no-fsync=true >"$dir/etcd.log" 2>&1 &
echo $! >"$dir/etcd.pid"
for _ in $(seq 100); do curl -sf http://127.0.0.1:$p1/health | grep -q '"health":"true"' && break; sleep 0.2; done

"$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:$p1 --cert-dir="$dir/apiserver-certs" \
  --tls-cert-file="$dir/pki/serving.crt" --tls-private-key-file="$dir/pki/serving.key" \
  --client-ca-file="$dir/pki/ca.crt" --secure-port=$p3 --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true --authorization-mode=RBAC \
  --disable-admission-plugins=ServiceAccount --feature-gates=ShardedListAndWatch=true \
  --service-account-issuer=https://127.0.0.1:$p3 \
  --service-account-key-file="$dir/pki/sa.pub" --service-account-signing-key-file="$dir/pki/sa.key" \
  >"$dir/kube-apiserver.log" 2>&1 &
echo $! >"$dir/apiserver.pid"

cat >"$dir/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "https://127.0.0.1:$p3", certificate-authority: "$dir/pki/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$dir/pki/admin.crt", client-key: "$dir/pki/admin.key"}}]
contexts: [{name: bench, context: {cluster: bench, user: admin, namespace: default}}]
current-context: bench
EOF
for _ in $(seq 300); do
  curl -sf --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key "https://127.0.0.1:$p3/readyz" >/dev/null && break
  sleep 0.2
done
curl -sf --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key "https://127.0.0.1:$p3/readyz" >/dev/null
# The default namespace appears shortly after /readyz.
for _ in $(seq 100); do "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" get ns default >/dev/null 2>&1 && break; sleep 0.2; done
echo "$dir/admin.kubeconfig"
