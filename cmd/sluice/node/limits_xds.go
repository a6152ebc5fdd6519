package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/sluice-io/sluice/api/limits"
)

// LimitsXDSConfig takes the limits from an xDS management server instead
// of a file, as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW
// (see limits.XDSOptions).
type LimitsXDSConfig struct {
	// Server is the management server's host:port; setting it takes the
	// limits from it (envoyproxy/ratelimit's CONFIG_GRPC_XDS_SERVER_URL).
	// Default empty: no xDS.
	Server string
	// NodeID is the node id presented to the server, which picks the
	// limits by it (CONFIG_GRPC_XDS_NODE_ID). Default "default".
	NodeID string
	// CAFile, when set, connects over TLS and verifies the server's
	// certificate against this CA (CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
	// Default empty: clear text.
	CAFile string
	// CertFile and KeyFile, when set with CAFile, are the client
	// certificate presented to the server (CONFIG_GRPC_XDS_CLIENT_TLS_CERT,
	// CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
	CertFile, KeyFile string
	// NodeMetadata is sent with the node id (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are added to the stream's metadata, for example a token the
	// server wants (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
}

// newLimitsWatcher returns the watcher of the limits file, or of the xDS
// server, nil when the node has neither. Each reload is counted and
// updates the node's health (a node that takes its limits from xDS is not
// ready until the first set is in force).
func (n *Node) newLimitsWatcher() (*limits.Watcher, error) {
	cfg := n.cfg
	o := limits.WatcherOptions{
		Path:         cfg.LimitsFile,
		MergeDomains: cfg.MergeDomainConfig,
		Interval:     cfg.LimitsPollInterval,
		Logger:       n.log, // the watcher adds component=limits
		OnReload: func(*limits.Config) {
			n.metrics.limitsReloads.WithLabelValues("ok").Inc()
			n.updateHealth()
		},
		OnError: func(error) { n.metrics.limitsReloads.WithLabelValues("error").Inc() },
	}
	switch x := cfg.LimitsXDS; {
	case x.Server != "":
		xo := &limits.XDSOptions{Server: x.Server, NodeID: x.NodeID, NodeMetadata: x.NodeMetadata, Headers: x.Headers}
		if (x.CertFile == "") != (x.KeyFile == "") || x.CertFile != "" && x.CAFile == "" {
			return nil, errors.New("node: --limits-xds-cert and --limits-xds-key go together, and with --limits-xds-ca")
		}
		if x.CAFile != "" {
			pem, err := os.ReadFile(x.CAFile)
			if err != nil {
				return nil, fmt.Errorf("node: read the xDS server's CA (--limits-xds-ca): %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("node: the xDS server's CA %s holds no PEM certificate", x.CAFile)
			}
			xo.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
			if x.CertFile != "" {
				cert, err := tls.LoadX509KeyPair(x.CertFile, x.KeyFile)
				if err != nil {
					return nil, fmt.Errorf("node: load the xDS client certificate %s, %s: %w", x.CertFile, x.KeyFile, err)
				}
				xo.TLS.Certificates = []tls.Certificate{cert}
			}
		}
		o.XDS = xo
	case cfg.LimitsFile == "":
		return nil, nil
	}
	return limits.NewWatcher(o)
}
