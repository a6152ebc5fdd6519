package api

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// selfSignedCert writes a certificate for 127.0.0.1 that is its own CA,
// and its key, as PEM files in dir.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	for file, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// TestClusterPeersOverTLS: with TLS and client certificates required,
// nodes forward to each other over TLS with their own certificate.
func TestClusterPeersOverTLS(t *testing.T) {
	cert, key := selfSignedCert(t, t.TempDir())
	tc := newTestClusterWith(t, 2, func(c *Config) { c.TLSCert, c.TLSKey, c.TLSClientCA = cert, key, cert })
	owners := map[string]int{}
	for k := 0; k < 20; k++ {
		resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("tls-%d", k), 5, time.Minute, 1)}})
		if err != nil || !resp.Decisions[0].Allowed {
			t.Fatalf("check tls-%d = %v, %v; want allowed", k, resp, err)
		}
		owners[resp.Decisions[0].Node]++
	}
	if owners["node-1"] == 0 {
		t.Fatalf("no check was forwarded to node-1: %v", owners)
	}
}
