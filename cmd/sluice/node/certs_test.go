package node

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/apitest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// certFiles are a certificate and key in the files a node reads, as a
// mounted Secret holds them (tls.crt, tls.key, ca.crt).
type certFiles struct {
	t        *testing.T
	dir      string // where the files are
	gen      string // where the certificates are made
	cert     string
	key, ca  string
	lastCert []byte
}

func newCertFiles(t *testing.T) *certFiles {
	dir := t.TempDir()
	return &certFiles{t: t, dir: dir, gen: t.TempDir(),
		cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), ca: filepath.Join(dir, "ca.crt")}
}

// make creates a self-signed certificate named cn and returns its files.
func (f *certFiles) make(cn string) (cert, key []byte) {
	f.t.Helper()
	certFile, keyFile := apitest.Cert(f.t, f.gen, cn)
	cert, err := os.ReadFile(certFile)
	if err != nil {
		f.t.Fatal(err)
	}
	key, err = os.ReadFile(keyFile)
	if err != nil {
		f.t.Fatal(err)
	}
	return cert, key
}

// install writes a new certificate named cn over the files (and, with
// ca, makes it the client CA too), each file replaced by a rename.
func (f *certFiles) install(cn string, ca bool) tls.Certificate {
	f.t.Helper()
	cert, key := f.make(cn)
	f.write(f.key, key)
	f.write(f.cert, cert)
	if ca {
		f.write(f.ca, cert)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		f.t.Fatal(err)
	}
	return pair
}

func (f *certFiles) write(path string, b []byte) {
	f.t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.t.Fatal(err)
	}
}

// served is the common name of the certificate a new TLS client of addr
// sees, presenting client if not nil; "" and the error if the handshake
// fails.
func served(addr string, client *tls.Certificate) (string, error) {
	cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	tc := conn.(*tls.Conn)
	// TLS 1.3 reports a refused client certificate on the first read.
	conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return "", err
	}
	return tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// waitServed polls until every address serves cn to a new client.
func waitServed(t *testing.T, cn string, client *tls.Certificate, addrs ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range addrs {
		if err := testkit.Wait(time.Until(deadline), func() error {
			if got, err := served(addr, client); got != cn {
				return fmt.Errorf("%s serves %q (%v) to a new client; want %q after the files changed", addr, got, err, cn)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTLSReload: a node reads its certificate files again when they
// change: a new client of the gRPC and HTTP listeners sees the new
// certificate without a restart; files that cannot be used are refused
// (counted, and ReloadTLS says why) and the previous certificate stays;
// the next good files are served.
func TestTLSReload(t *testing.T) {
	t.Parallel()
	f := newCertFiles(t)
	f.install("node-a", false)
	ts := newTestServer(t, func(c *Config) {
		c.TLSCert, c.TLSKey = f.cert, f.key
		c.TLSPollInterval = 20 * time.Millisecond
	})
	addrs := []string{ts.srv.GRPCAddr(), ts.srv.HTTPAddr()}
	waitServed(t, "node-a", nil, addrs...)

	f.install("node-b", false)
	waitServed(t, "node-b", nil, addrs...)

	// A certificate whose key is not its own, then a truncated file.
	_, otherKey := f.make("other")
	f.write(f.key, otherKey)
	if err := ts.srv.ReloadTLS(); err == nil || !strings.Contains(err.Error(), "private key does not match") {
		t.Errorf("ReloadTLS with a key of another certificate = %v; want a mismatch refused", err)
	}
	cert, key := f.make("node-c")
	f.write(f.key, key)
	f.write(f.cert, cert[:len(cert)/2])
	if err := ts.srv.ReloadTLS(); err == nil {
		t.Errorf("ReloadTLS with a truncated certificate = nil; want an error")
	}
	for _, addr := range addrs {
		if got, err := served(addr, nil); got != "node-b" {
			t.Errorf("%s serves %q (%v) after broken files; want the previous certificate, node-b", addr, got, err)
		}
	}
	if got := counterValue(t, ts, "sluice_tls_reloads_total", "error"); got < 1 {
		t.Errorf("sluice_tls_reloads_total{result=\"error\"} = %v; want at least 1", got)
	}

	f.write(f.cert, cert)
	waitServed(t, "node-c", nil, addrs...)
	if got := counterValue(t, ts, "sluice_tls_reloads_total", "ok"); got < 2 {
		t.Errorf("sluice_tls_reloads_total{result=\"ok\"} = %v; want at least 2 (node-b, node-c)", got)
	}
	if got, want := ts.srv.certs.notAfter(), leaf(t, cert).NotAfter; !got.Equal(want) {
		t.Errorf("certificate expiry in force = %v; want node-c's, %v", got, want)
	}
}

// TestTLSReloadClientCA: a rotated client CA is in force from the next
// handshake: clients signed by the new CA get in, those of the old one no
// longer do.
func TestTLSReloadClientCA(t *testing.T) {
	t.Parallel()
	f := newCertFiles(t)
	a := f.install("node-a", true)
	ts := newTestServer(t, func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = f.cert, f.key, f.ca
		c.TLSPollInterval = 20 * time.Millisecond
	})
	addr := ts.srv.GRPCAddr()
	if got, err := served(addr, &a); got != "node-a" {
		t.Fatalf("client with node-a's certificate: %q, %v; want served", got, err)
	}
	b := f.install("node-b", true)
	waitServed(t, "node-b", &b, addr)
	if got, err := served(addr, &a); err == nil {
		t.Errorf("client with node-a's certificate after the CA became node-b: served %q; want refused", got)
	}
}

// TestPeerTLSFollowsReload: the node dials its peers with the certificate
// in force, and verifies them against the client CA in force.
func TestPeerTLSFollowsReload(t *testing.T) {
	t.Parallel()
	f := newCertFiles(t)
	f.install("node-a", true)
	c, err := newCerts(Config{TLSCert: f.cert, TLSKey: f.key, TLSClientCA: f.ca}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A peer serving peerCert and asking for a client certificate; it
	// reports the common name of the one it got.
	dialPeer := func(peerCert tls.Certificate) (string, error) {
		lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{peerCert}, ClientAuth: tls.RequireAnyClientCert})
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		got := make(chan string, 1)
		go func() {
			conn, err := lis.Accept()
			if err != nil {
				got <- ""
				return
			}
			defer conn.Close()
			tc := conn.(*tls.Conn)
			if tc.Handshake() != nil || len(tc.ConnectionState().PeerCertificates) == 0 {
				got <- ""
				return
			}
			got <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
		}()
		cfg := c.peerConfig()
		cfg.ServerName = "127.0.0.1" // as gRPC sets it from the address
		conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
		if err != nil {
			lis.Close()
			<-got
			return "", err
		}
		defer conn.Close()
		return <-got, nil
	}
	a := c.cur.Load().cert
	if got, err := dialPeer(*a); got != "node-a" {
		t.Fatalf("dialling a node-a peer: presented %q, %v; want node-a", got, err)
	}
	b := f.install("node-b", true)
	if err := c.reload(); err != nil {
		t.Fatal(err)
	}
	if got, err := dialPeer(b); got != "node-b" {
		t.Errorf("dialling a node-b peer after the rotation: presented %q, %v; want node-b", got, err)
	}
	if _, err := dialPeer(*a); err == nil {
		t.Errorf("dialling a node-a peer after the CA became node-b: accepted; want its certificate refused")
	}
}

func leaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
