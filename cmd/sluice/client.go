package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// clientOptions are the connection flags of the client commands. Each of
// them also reads SLUICE_<FLAG>.
type clientOptions struct {
	addr          string
	adminToken    string
	timeout       time.Duration
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	insecure      bool
	output        string
	// noRetry turns the retry policy off (see retryServiceConfig), for
	// calls a retry could apply twice. Not a flag.
	noRetry bool
}

// register adds the connection flags to fs.
func (o *clientOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "gRPC address of a Sluice node")
	fs.StringVar(&o.adminToken, "admin-token", "", `admin token, sent as "authorization: Bearer <token>"`)
	fs.Var(newDurationValue(&o.timeout, 5*time.Second), "timeout", "deadline of each call")
	fs.BoolVar(&o.tls, "tls", false, "connect with TLS, verifying the server against the system's roots (the other --tls flags and --insecure imply TLS too)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "connect with TLS, verifying the server against this CA file (PEM)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "client certificate file (PEM), for a server with --tls-client-ca; needs --tls-key")
	fs.StringVar(&o.tlsKey, "tls-key", "", "private key file (PEM) of --tls-cert")
	fs.StringVar(&o.tlsServerName, "tls-server-name", "", "name the server's certificate must carry (default: the host of --addr)")
	fs.BoolVar(&o.insecure, "insecure", false, "connect with TLS without verifying the server's certificate (tests only)")
	fs.VarP(newEnumValue(&o.output, "table", "table", "json"), "output", "o", "output format: table for people, json (protojson, proto field names) for scripts")
	// Only the connection flags read the environment, even when fs holds a
	// command's request flags too.
	bindEnv(fs, "addr", "admin-token", "timeout", "tls", "tls-ca", "tls-cert", "tls-key", "tls-server-name", "insecure", "output")
}

// json reports whether the output is JSON.
func (o *clientOptions) json() bool { return o.output == "json" }

// usesTLS reports whether a TLS flag is set.
func (o *clientOptions) usesTLS() bool {
	return o.tls || o.insecure || o.tlsCA != "" || o.tlsCert != "" || o.tlsServerName != ""
}

// transportCredentials returns plaintext unless a TLS flag is set.
func (o *clientOptions) transportCredentials() (credentials.TransportCredentials, error) {
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if o.insecure && o.tlsCA != "" {
		return nil, errors.New("--insecure skips the verification --tls-ca asks for: use one of them")
	}
	if !o.usesTLS() {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         o.tlsServerName,
		InsecureSkipVerify: o.insecure,
	}
	if o.tlsCA != "" {
		pem, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", o.tlsCA)
		}
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(tc), nil
}

// client is a connection to a node.
type client struct {
	opts     *clientOptions
	conn     *grpc.ClientConn
	rl       sluicepb.RateLimitServiceClient
	admin    sluicepb.AdminServiceClient
	answered atomic.Bool // the node answered the last call (see recordAnswer)
}

// dial prepares a connection to --addr; it connects on the first call.
func (o *clientOptions) dial() (*client, error) {
	if err := checkAddr(o.addr); err != nil {
		return nil, err
	}
	creds, err := o.transportCredentials()
	if err != nil {
		return nil, err
	}
	c := &client{opts: o}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("sluice-cli/" + buildVersion().Version),
		grpc.WithChainUnaryInterceptor(c.recordAnswer),
		grpc.WithDefaultServiceConfig(retryServiceConfig),
	}
	if o.noRetry {
		opts = append(opts, grpc.WithDisableRetry())
	}
	if c.conn, err = grpc.NewClient(o.addr, opts...); err != nil {
		return nil, fmt.Errorf("--addr %s: %w", o.addr, err)
	}
	c.rl, c.admin = sluicepb.NewRateLimitServiceClient(c.conn), sluicepb.NewAdminServiceClient(c.conn)
	return c, nil
}

func (c *client) close() { c.conn.Close() }

// callContext returns the context of one call: --timeout and the admin
// token.
func (c *client) callContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := parent, context.CancelFunc(func() {})
	if c.opts.timeout > 0 {
		ctx, cancel = context.WithTimeout(parent, c.opts.timeout)
	}
	if c.opts.adminToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.adminToken)
	}
	return ctx, cancel
}

// callError turns the error of a call into one line for people.
func (c *client) callError(err error) error {
	st, retried, ok := callStatus(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		return c.unavailable(st, retried)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from %s within --timeout %v: %s", c.opts.addr, c.opts.timeout, msg)
	case codes.Unimplemented:
		if strings.Contains(msg, "sluice.v1.AdminService") {
			return fmt.Errorf("the server at %s does not serve the admin API (a node started with --admin-addr serves it there only; point --addr at it): %s", c.opts.addr, msg)
		}
		return fmt.Errorf("the server at %s does not implement this call: %s", c.opts.addr, msg)
	}
	return fmt.Errorf("%s (%s)", msg, st.Code())
}
