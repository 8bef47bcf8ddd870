package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// Certs is a throwaway PKI for one test, as PEM files in a temporary
// directory: a CA, a server certificate for 127.0.0.1 and localhost, and a
// client certificate, all signed by the CA and valid for a day.
type Certs struct {
	CAFile         string // the CA's certificate: trust it
	ServerCertFile string // server certificate (SANs 127.0.0.1, ::1, localhost)
	ServerKeyFile  string
	ClientCertFile string // client certificate (CN ClientCN)
	ClientKeyFile  string
}

// ClientCN is the common name of the client certificate NewCerts makes.
const ClientCN = "sluice-test-client"

// NewCerts generates a CA, a server and a client certificate (ECDSA P-256)
// with crypto/x509 into tb.TempDir(). No openssl is needed.
func NewCerts(tb testing.TB) *Certs {
	tb.Helper()
	dir := tb.TempDir()
	now := time.Now()
	caKey := newKey(tb)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("etcdtest: CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatalf("etcdtest: CA certificate: %v", err)
	}
	c := &Certs{CAFile: writePEM(tb, dir, "ca.pem", "CERTIFICATE", caDER)}

	leaf := func(name string, tmpl *x509.Certificate) (certFile, keyFile string) {
		key := newKey(tb)
		tmpl.SerialNumber = serial(tb)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatalf("etcdtest: %s certificate: %v", name, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			tb.Fatalf("etcdtest: %s key: %v", name, err)
		}
		return writePEM(tb, dir, name+".pem", "CERTIFICATE", der), writePEM(tb, dir, name+"-key.pem", "PRIVATE KEY", keyDER)
	}
	// The server certificate is also a client one: etcd's gRPC gateway dials
	// the member with it when client certificates are required.
	c.ServerCertFile, c.ServerKeyFile = leaf("server", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	c.ClientCertFile, c.ClientKeyFile = leaf("client", &x509.Certificate{
		Subject:     pkix.Name{CommonName: ClientCN},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return c
}

// ClientTLSInfo returns the client side's TLS material: trust the CA,
// present the client certificate. Call ClientConfig on it for a
// *tls.Config, as configd's --etcd-ca/--etcd-cert/--etcd-key do.
func (c *Certs) ClientTLSInfo() transport.TLSInfo {
	return transport.TLSInfo{CertFile: c.ClientCertFile, KeyFile: c.ClientKeyFile, TrustedCAFile: c.CAFile}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("etcdtest: key: %v", err)
	}
	return k
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("etcdtest: serial: %v", err)
	}
	return n
}

func writePEM(tb testing.TB, dir, name, typ string, der []byte) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return p
}
