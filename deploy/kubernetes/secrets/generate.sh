#!/bin/sh
# Creates what deploy/kubernetes's secretGenerator reads, in this folder:
#   admin-token                    configd's admin API bearer token
#   ca.crt, ca.key                 a CA for etcd (keep ca.key safe, or delete it)
#   server.crt, server.key         the reference etcd members' certificate (server and peer)
#   client.crt, client.key         the client certificate configd and instances use
#   etcd-endpoints                 the etcd client URLs
# Existing files are kept: delete them to regenerate. With your own etcd,
# write etcd-endpoints, ca.crt, client.crt and client.key yourself, and
# drop etcd.yaml and the sluice-etcd-server secret from kustomization.yaml.
#
# NAMESPACE (default sluice) must match kustomization.yaml's namespace.
set -eu
cd "$(dirname "$0")"
ns=${NAMESPACE:-sluice}
days=${DAYS:-825}
umask 077

if [ ! -f admin-token ]; then
	openssl rand -hex 32 > admin-token
fi
if [ ! -f etcd-endpoints ]; then
	printf 'https://sluice-etcd-0.sluice-etcd.%s.svc:2379,https://sluice-etcd-1.sluice-etcd.%s.svc:2379,https://sluice-etcd-2.sluice-etcd.%s.svc:2379' "$ns" "$ns" "$ns" > etcd-endpoints
fi
if [ ! -f ca.crt ]; then
	openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days "$days" \
		-keyout ca.key -out ca.crt -subj "/CN=sluice-etcd-ca"
fi
if [ ! -f server.crt ]; then
	openssl req -new -nodes -newkey rsa:2048 -keyout server.key -out server.csr -subj "/CN=sluice-etcd"
	cat > server.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:*.sluice-etcd.$ns.svc,DNS:*.sluice-etcd.$ns.svc.cluster.local,DNS:sluice-etcd.$ns.svc,DNS:localhost,IP:127.0.0.1
EXT
	openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
		-out server.crt -days "$days" -sha256 -extfile server.ext
	rm -f server.csr server.ext
fi
if [ ! -f client.crt ]; then
	openssl req -new -nodes -newkey rsa:2048 -keyout client.key -out client.csr -subj "/CN=sluice"
	cat > client.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
	openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
		-out client.crt -days "$days" -sha256 -extfile client.ext
	rm -f client.csr client.ext
fi
echo "secrets ready in $(pwd); now: kubectl apply -k $(dirname "$(pwd)")"
