package main

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
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key as
// PEM files in dir, and returns their paths.
func writeCert(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestTLS: a node serving TLS with client certificates required answers a
// client that verifies it with --tls-ca and presents --tls-cert, and
// refuses the others.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCert, serverKey := writeCert(t, dir, "server")
	clientCert, clientKey := writeCert(t, dir, "client")
	n := startNode(t, nil, "--tls-cert", serverCert, "--tls-key", serverKey, "--tls-client-ca", clientCert)
	check := []string{"check", "k", "--limit", "5", "--window", "1m", "--addr", n.grpcAddr}

	mustRun(t, exitOK, nil, append(check, "--tls-ca", serverCert, "--tls-cert", clientCert, "--tls-key", clientKey)...)
	mustRun(t, exitOK, env{"SLUICE_TLS_CA": serverCert, "SLUICE_TLS_CERT": clientCert, "SLUICE_TLS_KEY": clientKey}, check...)
	mustRun(t, exitOK, nil, append(check, "--insecure", "--tls-cert", clientCert, "--tls-key", clientKey)...)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"plaintext", nil}, // the error suggests --tls-ca
		{"no client certificate", []string{"--tls-ca", serverCert}},
		{"unknown server", []string{"--tls-ca", clientCert, "--tls-cert", clientCert, "--tls-key", clientKey}},
	} {
		r := runCLI(t, nil, append(check, tc.args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, n.grpcAddr) {
			t.Errorf("%s: %v\nwant exit code 1 and an error naming the address", tc.name, r)
		}
	}
	r := mustRun(t, exitError, nil, append(check, "--insecure", "--tls-ca", serverCert)...)
	if !strings.Contains(r.stderr, "--insecure skips the verification --tls-ca asks for") {
		t.Errorf("--insecure with --tls-ca: stderr %q; want the conflict explained", r.stderr)
	}
}
