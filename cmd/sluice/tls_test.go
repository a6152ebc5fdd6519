package main

import (
	"strings"
	"testing"

	"github.com/sluice-io/sluice/api/apitest"
)

// TestTLS: a node serving TLS with client certificates required answers a
// client that verifies it with --tls-ca and presents --tls-cert, and
// refuses the others.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCert, serverKey := apitest.Cert(t, dir, "server")
	clientCert, clientKey := apitest.Cert(t, dir, "client")
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
