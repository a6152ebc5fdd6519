package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/cluster"
)

// retryServiceConfig is the gRPC service config of the client commands:
// a call to a sluice.v1 service that fails with UNAVAILABLE is tried up to
// four times, 50 ms, 100 ms and 200 ms apart (with gRPC's jitter). That
// covers the moment a key's ownership moves ("ownership moving"), which
// passes within a second. A retried check may have been recorded by the
// attempt that failed (a standby that did not confirm, an owner that did
// not answer in time): it then counts twice, never less. Refunds are not
// retried (see clientOptions.noRetry).
const retryServiceConfig = `{
  "methodConfig": [{
    "name": [{"service": "sluice.v1.RateLimitService"}, {"service": "sluice.v1.AdminService"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.05s",
      "maxBackoff": "0.2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// defaultGRPCPort is the port of serve's default --grpc-addr.
const defaultGRPCPort = "8081"

// checkAddr reports an --addr that gRPC would take but that is most likely
// a mistake: a host without a port, which gRPC dials on 443. Targets with
// a scheme (dns:///, unix:, passthrough:///) go to gRPC as they are.
func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("--addr is empty: give the gRPC address of a Sluice node")
	}
	if strings.Contains(addr, "://") || strings.HasPrefix(addr, "unix:") {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
		if strings.Contains(host, ":") && net.ParseIP(host) == nil {
			return fmt.Errorf("--addr %s: want host:port, e.g. 127.0.0.1:%s", addr, defaultGRPCPort)
		}
	} else if port != "" {
		return nil
	}
	return fmt.Errorf("--addr %s has no port (the gRPC API listens on %s by default): try --addr %s", addr, defaultGRPCPort, net.JoinHostPort(host, defaultGRPCPort))
}

// callStatus returns the status of a failed call as the server (or the
// transport) gave it, and whether gRPC gave up retrying it: gRPC wraps the
// last attempt's status in an error of its own then ("max retries
// exhausted: ..."), whose message repeats the status's.
func callStatus(err error) (st *status.Status, retried, ok bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return nil, false, false
	}
	_, direct := err.(interface{ GRPCStatus() *status.Status })
	return se.GRPCStatus(), !direct, true
}

// recordAnswer is a unary interceptor that notes whether the node answered
// the call (the call got as far as the server), to tell "the node I asked
// is down" from "the node I asked said UNAVAILABLE".
func (c *client) recordAnswer(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	c.answered.Store(p.Addr != nil)
	return err
}

// unavailable turns an UNAVAILABLE status into one line that says which
// node is unavailable: the node asked, which could not be reached or is
// not a gRPC server (found by probing --addr), or, when it answered, the
// node it could not reach itself.
//
// retried says that gRPC gave up retrying (see retryServiceConfig).
func (c *client) unavailable(st *status.Status, retried bool) error {
	addr := c.opts.addr
	if info := errorInfo(st); info != nil || c.answered.Load() {
		code := "Unavailable"
		if retried {
			code = "Unavailable, after retries"
		}
		if info != nil && info.Reason == cluster.ReasonOwnerUnreachable && info.Metadata["member"] != "" {
			return fmt.Errorf("%s is up, but could not reach %s, the node that decides this key (is it running? sluice members shows what %s sees): %s (%s)", addr, info.Metadata["member"], addr, st.Message(), code)
		}
		return fmt.Errorf("%s is up, but could not decide: %s (%s)", addr, st.Message(), code)
	}
	timeout := 2 * time.Second
	if c.opts.timeout > 0 {
		timeout = min(timeout, c.opts.timeout)
	}
	switch p := probe(addr, timeout); {
	case p.dialErr != nil:
		return fmt.Errorf("cannot reach %s (is sluice serve running there? set --addr or SLUICE_ADDR): %v", addr, p.dialErr)
	case p.http1 != "":
		return fmt.Errorf("%s answered %s, not gRPC: is that the --http-addr? the gRPC API is on --grpc-addr (127.0.0.1:%s by default)", addr, p.http1, defaultGRPCPort)
	case p.http2 && c.opts.usesTLS():
		return fmt.Errorf("%s serves gRPC without TLS: leave out --tls, --tls-ca, --tls-server-name and --insecure", addr)
	case p.closed && !c.opts.usesTLS():
		return fmt.Errorf("%s closed the connection without answering gRPC in clear text: if it serves TLS, give --tls-ca, --tls or --insecure: %s", addr, st.Message())
	}
	return fmt.Errorf("%s is unavailable: %s", addr, st.Message())
}

// errorInfo returns the Sluice ErrorInfo among st's details, nil if none.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == cluster.ErrorDomain {
			return info
		}
	}
	return nil
}

// probeResult is what an address did with the opening of an HTTP/2
// connection in clear text (what a gRPC client without TLS sends first).
type probeResult struct {
	dialErr error  // nothing could be reached
	http1   string // it answered HTTP/1.x: the version, "HTTP/1.1"
	http2   bool   // it answered with an HTTP/2 frame: a gRPC server in clear text
	closed  bool   // it closed the connection, or said nothing, without answering
}

// http2Preface is the client connection preface of HTTP/2 followed by an
// empty SETTINGS frame (RFC 9113, section 3.4).
var http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// probe connects to addr (host:port) and sends an HTTP/2 preface in clear
// text, to tell a port nothing listens on from an HTTP/1 server (the
// --http-addr), a TLS server, or a gRPC server without TLS. It gives up
// after timeout. An addr that is not host:port is not probed.
func probe(addr string, timeout time.Duration) probeResult {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return probeResult{}
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return probeResult{dialErr: err}
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(http2Preface); err != nil {
		return probeResult{closed: true}
	}
	head, err := bufio.NewReader(conn).Peek(9) // an HTTP/2 frame header, or "HTTP/1.1 "
	switch {
	case bytes.HasPrefix(head, []byte("HTTP/1.")) && len(head) >= 8:
		return probeResult{http1: string(head[:8])}
	case len(head) == 9 && head[3] == 0x4: // a SETTINGS frame
		return probeResult{http2: true}
	case err != nil:
		return probeResult{closed: true}
	}
	return probeResult{}
}
