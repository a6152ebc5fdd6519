package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// certs is the node's TLS material: its certificate and key and, if set,
// the CA its clients (and peers) must be signed by. The files are read at
// New, then again every Config.TLSPollInterval and on ReloadTLS (SIGHUP),
// so that a certificate rotated on disk (cert-manager renews it, the
// kubelet swaps the mounted Secret's files) is served without a restart.
//
// Every handshake takes the material in force at that moment: new
// connections get the new certificate, established ones keep theirs.
// Files that changed but cannot be used (a key that does not match the
// certificate, a half-written file, a CA file without a certificate) are
// refused whole: the previous material stays in force, the refusal is
// logged once per content, and the next change is tried again.
type certs struct {
	certFile, keyFile, caFile string
	log                       *slog.Logger
	onReload                  func(ok bool) // counts reloads; may be nil

	cur atomic.Pointer[certState]

	mu         sync.Mutex   // serializes reloads; guards refused
	refused    certContents // the contents last refused, not logged again
	refusedErr error

	life    sync.Mutex
	stop    chan struct{}
	done    chan struct{}
	started bool
	closed  bool
}

// certContents is what the three files held, "" for a file not set.
type certContents struct{ cert, key, ca string }

// certState is one generation of the material, with the server configs
// handed out per handshake built from it.
type certState struct {
	files certContents
	cert  *tls.Certificate
	pool  *x509.CertPool // nil without a CA file
	grpc  *tls.Config    // gRPC adds its ALPN protocol itself
	http  *tls.Config    // HTTP/2 and HTTP/1.1
}

// newCerts reads the files named by cfg; an error stops the node from
// starting. log may be nil.
func newCerts(cfg Config, log *slog.Logger, onReload func(ok bool)) (*certs, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &certs{certFile: cfg.TLSCert, keyFile: cfg.TLSKey, caFile: cfg.TLSClientCA, log: log, onReload: onReload}
	files, err := c.read()
	if err != nil {
		return nil, err
	}
	st, err := c.parse(files)
	if err != nil {
		return nil, err
	}
	c.cur.Store(st)
	return c, nil
}

// read returns the files' contents.
func (c *certs) read() (certContents, error) {
	var files certContents
	for _, f := range []struct {
		path, what string
		to         *string
	}{{c.certFile, "TLS certificate", &files.cert}, {c.keyFile, "TLS key", &files.key}, {c.caFile, "client CA", &files.ca}} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return files, fmt.Errorf("node: read %s: %w", f.what, err)
		}
		*f.to = string(b)
	}
	return files, nil
}

// parse builds the material from the files' contents.
func (c *certs) parse(files certContents) (*certState, error) {
	cert, err := tls.X509KeyPair([]byte(files.cert), []byte(files.key))
	if err != nil {
		return nil, fmt.Errorf("node: load TLS key pair %s, %s: %w", c.certFile, c.keyFile, err)
	}
	st := &certState{files: files, cert: &cert}
	st.grpc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.caFile != "" {
		st.pool = x509.NewCertPool()
		if !st.pool.AppendCertsFromPEM([]byte(files.ca)) {
			return nil, fmt.Errorf("node: client CA %s holds no PEM certificate", c.caFile)
		}
		st.grpc.ClientCAs, st.grpc.ClientAuth = st.pool, tls.RequireAndVerifyClientCert
	}
	st.http = st.grpc.Clone()
	st.http.NextProtos = []string{"h2", "http/1.1"}
	return st, nil
}

// reload reads the files and, if they changed and can be used, puts them
// in force. It returns why changed files were refused (the previous
// material stays), nil when they are in force or did not change.
func (c *certs) reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	files, err := c.read()
	if err == nil {
		if files == c.cur.Load().files {
			return nil
		}
		if files == c.refused {
			return c.refusedErr // logged already
		}
		var st *certState
		if st, err = c.parse(files); err == nil {
			c.cur.Store(st)
			c.refused, c.refusedErr = certContents{}, nil
			c.log.Info("reloaded TLS certificate", "subject", st.cert.Leaf.Subject.String(),
				"serial", st.cert.Leaf.SerialNumber.String(), "not_after", st.cert.Leaf.NotAfter, "client_ca", c.caFile != "")
			c.count(true)
			return nil
		}
	}
	// Log a refusal once, not at every poll while the files stay as they
	// are.
	if files != c.refused || c.refusedErr == nil || err.Error() != c.refusedErr.Error() {
		c.log.Error("TLS files changed but cannot be used; serving the previous certificate", "err", err)
		c.count(false)
	}
	c.refused, c.refusedErr = files, err
	return err
}

func (c *certs) count(ok bool) {
	if c.onReload != nil {
		c.onReload(ok)
	}
}

// notAfter is when the certificate in force expires.
func (c *certs) notAfter() time.Time { return c.cur.Load().cert.Leaf.NotAfter }

// serverConfig is the TLS config of the gRPC listeners (http false) or of
// the HTTP listener: each handshake gets the material then in force.
func (c *certs) serverConfig(http bool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			if http {
				return c.cur.Load().http, nil
			}
			return c.cur.Load().grpc, nil
		},
	}
}

// peerConfig is the TLS config the node dials its peers with: its own
// certificate, and the peer's verified against the client CA then in
// force (without a CA file, peers are not verified, but the traffic is
// still encrypted).
func (c *certs) peerConfig() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.cur.Load().cert, nil
		},
		// Verified in VerifyConnection, against the CA in force, which a
		// fixed RootCAs could not follow.
		InsecureSkipVerify: true,
	}
	if c.caFile != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("node: peer presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: c.cur.Load().pool, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return cfg
}

// start polls the files every interval until close.
func (c *certs) start(interval time.Duration) {
	c.life.Lock()
	defer c.life.Unlock()
	if c.started || c.closed || interval <= 0 {
		return
	}
	c.started = true
	c.stop, c.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(c.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				c.reload() // logs what it refuses
			}
		}
	}()
}

// close stops polling and waits for it. It is idempotent.
func (c *certs) close() {
	c.life.Lock()
	if c.closed {
		c.life.Unlock()
		return
	}
	c.closed = true
	started := c.started
	if started {
		close(c.stop)
	}
	c.life.Unlock()
	if started {
		<-c.done
	}
}
