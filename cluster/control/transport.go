package control

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc/mem"
)

// Raft travels on the node's peer port, beside the peer service's gRPC: a
// Mux splits the port's connections by their first byte. A Raft
// connection starts with raftMagic, which neither HTTP/2's preface ("PRI")
// nor a TLS record (0x16) can start with; then TLS when the node has it;
// then a handshake that proves the dialler knows the cluster's peer secret
// (the admin token) and names its cluster:
//
//	server → client: 16 random bytes (a nonce)
//	client → server: 1 byte version (1), 1 byte length and the client's
//	                 cluster ID ("" before it joined), 32 bytes
//	                 HMAC-SHA256(secret, nonce ‖ cluster ID)
//	server → client: 0 (accepted), or 1, a length byte and why not
//
// A server refuses a wrong MAC, and a cluster ID other than its own when
// both are known. Raft's own transport then runs on the connection.

// raftMagic is the first byte of every Raft connection on the peer port.
const raftMagic = 0xC5

// handshakeTimeout bounds the first byte and the handshake of a new
// connection.
const handshakeTimeout = 10 * time.Second

// Mux splits a listener's connections between gRPC and Raft.
type Mux struct {
	base net.Listener
	grpc *muxListener
	raft *muxListener

	mu     sync.Mutex
	open   int // views not closed yet
	closed bool
	wg     sync.WaitGroup
}

// NewMux starts splitting base's connections. Close both views (GRPC and
// Raft) to close base.
func NewMux(base net.Listener) *Mux {
	m := &Mux{base: base, open: 2}
	m.grpc = &muxListener{m: m, conns: make(chan net.Conn), done: make(chan struct{})}
	m.raft = &muxListener{m: m, conns: make(chan net.Conn), done: make(chan struct{})}
	m.wg.Add(1)
	go m.run()
	return m
}

// GRPC is the listener of the connections that are not Raft's.
func (m *Mux) GRPC() net.Listener { return m.grpc }

// Raft is the listener of the Raft connections, their first byte read.
func (m *Mux) Raft() net.Listener { return m.raft }

func (m *Mux) run() {
	defer m.wg.Done()
	for {
		c, err := m.base.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			m.grpc.fail(err)
			m.raft.fail(err)
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.route(c)
		}()
	}
}

// route reads c's first byte and hands c to the view it belongs to.
func (m *Mux) route(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	if b[0] == raftMagic {
		m.raft.deliver(c)
		return
	}
	p := &prefixConn{Conn: c, first: b[0], pending: true}
	if rr, ok := c.(readyReader); ok {
		m.grpc.deliver(&readyPrefixConn{prefixConn: p, rr: rr})
		return
	}
	m.grpc.deliver(p)
}

// closeView closes base once both views are closed.
func (m *Mux) closeView() {
	m.mu.Lock()
	m.open--
	last := m.open == 0 && !m.closed
	if last {
		m.closed = true
	}
	m.mu.Unlock()
	if last {
		m.base.Close()
		m.wg.Wait()
	}
}

type muxListener struct {
	m     *Mux
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
	mu    sync.Mutex
	err   error
}

func (l *muxListener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *muxListener) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.once.Do(func() { close(l.done) })
}

func (l *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *muxListener) Close() error {
	first := false
	l.once.Do(func() {
		first = true
		close(l.done)
	})
	if first {
		l.m.closeView()
	}
	return nil
}

func (l *muxListener) Addr() net.Addr { return l.m.base.Addr() }

// prefixConn gives back the byte the Mux read.
type prefixConn struct {
	net.Conn
	first   byte
	pending bool
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if c.pending && len(p) > 0 {
		c.pending = false
		p[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(p)
}

// readyReader is a connection that gRPC reads only once data has arrived,
// with a buffer from its pool (grpc's internal/transport/readyreader), so
// that an idle connection holds no read buffer: cmd/sluice/node's
// connections. A connection without it gets a 32 KiB buffer of its own.
type readyReader interface {
	ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error)
}

// readyPrefixConn is a prefixConn that keeps its connection's ReadOnReady:
// without it, every connection to a clustered node held 42 KB of heap
// idle instead of 9 KB.
type readyPrefixConn struct {
	*prefixConn
	rr readyReader
}

func (c *readyPrefixConn) ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	if c.pending && bufSize > 0 {
		c.pending = false
		b := pool.Get(bufSize)
		(*b)[0] = c.first
		return b, 1, nil
	}
	return c.rr.ReadOnReady(bufSize, pool)
}

// TransportConfig configures the Raft stream layer.
type TransportConfig struct {
	// Listener is the Mux's Raft view.
	Listener net.Listener
	// Advertise is the address the other members dial (the peer address).
	Advertise string
	// Secret proves a member of the cluster (the admin token); empty
	// accepts any dialler, for a loopback or --insecure cluster.
	Secret []byte
	// ServerTLS and ClientTLS wrap the connections when the node has TLS.
	ServerTLS, ClientTLS *tls.Config
	// ClusterID returns the cluster's ID, "" before this node knows it.
	ClusterID func() string
}

// stream is a raft.StreamLayer over the Mux with the handshake above.
type stream struct {
	cfg      TransportConfig
	addr     net.Addr
	accepted chan net.Conn
	quit     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	// dials is the context of every Dial, cancelled by stopDials:
	// Raft's Shutdown waits for its calls in flight, which would otherwise
	// go on dialling members that are down for up to redialWindow.
	dials     context.Context
	stopDials context.CancelFunc
}

// newRaftTransport returns Raft's transport over s, replicating with one
// AppendEntries in flight per follower: no pipeline. hashicorp/raft's
// pipeline (MaxRPCsInFlight >= 2) can deadlock when a follower rejects an
// entry, which followers do after a restart: its decoder stops reading,
// one more send waits on the decoder, and the follower's replication
// stops for good while heartbeats still reach it (no election heals it),
// and Raft's Shutdown then waits forever (seen here: a node stuck after
// SIGTERM in a rolling restart; hashicorp/raft#612, grafana/pyroscope#5518).
// A round trip per batch of entries costs the control plane nothing it
// needs: its writes are a few per second.
func newRaftTransport(s *stream, logger hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s, MaxPool: 3, Timeout: 5 * time.Second, Logger: logger, MaxRPCsInFlight: 1,
	})
}

func newStream(cfg TransportConfig) (*stream, error) {
	addr, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
	if err != nil {
		return nil, fmt.Errorf("control: raft address %q: %w", cfg.Advertise, err)
	}
	s := &stream{cfg: cfg, addr: addr, accepted: make(chan net.Conn), quit: make(chan struct{})}
	s.dials, s.stopDials = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *stream) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.cfg.Listener.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c, err := s.serverHandshake(c)
			if err != nil {
				return
			}
			select {
			case s.accepted <- c:
			case <-s.quit:
				c.Close()
			}
		}()
	}
}

// serverHandshake runs the server's side of the handshake on c; it closes c
// on failure.
func (s *stream) serverHandshake(c net.Conn) (net.Conn, error) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	if s.cfg.ServerTLS != nil {
		tc := tls.Server(c, s.cfg.ServerTLS)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	if _, err := c.Write(nonce[:]); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil || head[0] != 1 {
		c.Close()
		return nil, fmt.Errorf("bad handshake")
	}
	cid := make([]byte, head[1])
	var mac [32]byte
	if _, err := io.ReadFull(br, cid); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(br, mac[:]); err != nil {
		c.Close()
		return nil, err
	}
	refuse := func(why string) (net.Conn, error) {
		msg := []byte(why)[:min(len(why), 255)]
		c.Write(append([]byte{1, byte(len(msg))}, msg...))
		c.Close()
		return nil, errors.New(why)
	}
	if !hmac.Equal(mac[:], proof(s.cfg.Secret, nonce[:], cid)) {
		return refuse("wrong peer secret (the admin token differs)")
	}
	if own := s.cfg.ClusterID(); own != "" && len(cid) > 0 && string(cid) != own {
		return refuse(fmt.Sprintf("cluster %s is not this node's cluster %s", cid, own))
	}
	if _, err := c.Write([]byte{0}); err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: c, r: br}, nil
	}
	return c, nil
}

func proof(secret, nonce, cid []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(nonce)
	h.Write(cid)
	return h.Sum(nil)
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Accept implements net.Listener.
func (s *stream) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.quit:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (s *stream) Close() error {
	s.once.Do(func() {
		close(s.quit)
		s.stopDials()
		s.cfg.Listener.Close()
	})
	return nil
}

// wait waits for the stream's goroutines, after Close.
func (s *stream) wait() { s.wg.Wait() }

// Addr implements net.Listener: the advertised address.
func (s *stream) Addr() net.Addr { return s.addr }

// Dial implements raft.StreamLayer.
func (s *stream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(s.dials, timeout)
	defer cancel()
	c, err := dialPatiently(ctx, string(address))
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{raftMagic}); err != nil {
		c.Close()
		return nil, err
	}
	if s.cfg.ClientTLS != nil {
		cfg := s.cfg.ClientTLS.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(string(address))
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	var nonce [16]byte
	if _, err := io.ReadFull(c, nonce[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("control: raft handshake with %s: %w", address, err)
	}
	cid := []byte(s.cfg.ClusterID())
	msg := append([]byte{1, byte(len(cid))}, cid...)
	msg = append(msg, proof(s.cfg.Secret, nonce[:], cid)...)
	if _, err := c.Write(msg); err != nil {
		c.Close()
		return nil, err
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("control: raft handshake with %s: %w", address, err)
	}
	if st[0] != 0 {
		var n [1]byte
		io.ReadFull(c, n[:])
		why := make([]byte, n[0])
		io.ReadFull(c, why)
		c.Close()
		return nil, fmt.Errorf("control: %s refused the raft connection: %s", address, why)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// redialWindow is how long Dial keeps trying an address that refuses
// connections. Raft's leader backs off exponentially (up to about ten
// seconds) after each failed call to a follower, counting failures: a
// follower that is down for a few seconds would then wait that long to be
// caught up after it is back. Failing slowly keeps the count, and so the
// wait, small; a follower that comes back meanwhile is reached at once.
const redialWindow = 2 * time.Second

// dialPatiently connects to addr, trying again every 100ms while the
// address refuses connections, for up to redialWindow (and ctx). Cancelled,
// it returns ctx's error.
func dialPatiently(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, redialWindow)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, ctx.Err()
			}
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
