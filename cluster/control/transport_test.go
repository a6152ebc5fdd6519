package control

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc/mem"
)

// muxStream listens on loopback, splits the port with a Mux and serves
// Raft's side with secret and cluster ID cid.
func muxStream(t *testing.T, secret, cid string) (*Mux, *stream) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(lis)
	s, err := newStream(TransportConfig{Listener: m.Raft(), Advertise: lis.Addr().String(), Secret: []byte(secret),
		ClusterID: func() string { return cid }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		s.wait()
		m.GRPC().Close()
	})
	return m, s
}

// TestMuxSplits: a connection that does not start with Raft's byte reaches
// the gRPC side with its first byte intact; a Raft dial reaches the Raft
// side through the handshake, and the bytes flow both ways.
func TestMuxSplits(t *testing.T) {
	m, s := muxStream(t, "secret", "c1")
	addr := s.Addr().String()

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PRI * HTTP/2.0"))
	g, err := m.GRPC().Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got, _ := bufio.NewReader(g).Peek(3)
	if string(got) != "PRI" {
		t.Fatalf("gRPC side read %q; want %q", got, "PRI")
	}

	dialer := &stream{cfg: TransportConfig{Secret: []byte("secret"), ClusterID: func() string { return "c1" }}, dials: context.Background()}
	rc, err := dialer.Dial(rafAddr(addr), time.Second)
	if err != nil {
		t.Fatalf("raft dial: %v", err)
	}
	defer rc.Close()
	ac, err := s.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	rc.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(ac, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("raft side read %q, %v; want ping", buf, err)
	}
}

// readyConn has ReadOnReady, as cmd/sluice/node's connections do.
type readyConn struct{ net.Conn }

func (c readyConn) ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	b := pool.Get(bufSize)
	n, err := c.Conn.Read(*b)
	return b, n, err
}

type readyListener struct{ net.Listener }

func (l readyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return readyConn{c}, nil
}

// TestMuxKeepsReadOnReady: the gRPC side's connection keeps the
// ReadOnReady of the listener's, with which gRPC holds no read buffer for
// an idle connection, and gives the first byte back through it.
func TestMuxKeepsReadOnReady(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(readyListener{lis})
	t.Cleanup(func() {
		m.GRPC().Close()
		m.Raft().Close()
	})
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const preface = "PRI * HTTP/2.0"
	c.Write([]byte(preface))
	g, err := m.GRPC().Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rr, ok := g.(readyReader)
	if !ok {
		t.Fatalf("the gRPC side's connection, a %T, has no ReadOnReady", g)
	}
	var got []byte
	for len(got) < len(preface) {
		b, n, err := rr.ReadOnReady(64, mem.DefaultBufferPool())
		if err != nil {
			t.Fatalf("ReadOnReady after %q: %v", got, err)
		}
		got = append(got, (*b)[:n]...)
	}
	if string(got) != preface {
		t.Errorf("read %q; want %q", got, preface)
	}
}

// TestHandshakeRefuses: a dialler without the cluster's secret, or from
// another cluster, is refused with the reason; one that does not know its
// cluster yet (a node joining) is let in.
func TestHandshakeRefuses(t *testing.T) {
	_, s := muxStream(t, "secret", "c1")
	addr := rafAddr(s.Addr().String())
	for _, tc := range []struct {
		name, secret, cid, wantErr string
	}{
		{"wrong secret", "other", "c1", "wrong peer secret"},
		{"other cluster", "secret", "c2", "cluster c2 is not this node's cluster c1"},
		{"joining", "secret", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &stream{cfg: TransportConfig{Secret: []byte(tc.secret), ClusterID: func() string { return tc.cid }}, dials: context.Background()}
			c, err := d.Dial(addr, time.Second)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Dial: %v; want accepted", err)
				}
				c.Close()
				ac, err := s.Accept()
				if err == nil {
					ac.Close()
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Dial: %v; want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func rafAddr(a string) raft.ServerAddress { return raft.ServerAddress(a) }

// TestRaftTransportDoesNotPipeline: Raft replicates over this transport
// with one AppendEntries in flight (see newRaftTransport): asked for a
// pipeline, it refuses, as hashicorp/raft's replication expects of a
// transport without one.
func TestRaftTransportDoesNotPipeline(t *testing.T) {
	_, s := muxStream(t, "secret", "c1")
	trans := newRaftTransport(s, hclog.NewNullLogger())
	defer trans.Close()
	p, err := trans.AppendEntriesPipeline("peer", raft.ServerAddress(s.Addr().String()))
	if !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("AppendEntriesPipeline: %v; want raft.ErrPipelineReplicationNotSupported", err)
	}
}

// TestDialStopsAtShutdown: a Dial that keeps trying an address refusing
// connections ends once the stream stops dialling, as Control.Shutdown
// makes it before Raft's Shutdown (which waits for the calls in flight),
// instead of trying for the rest of redialWindow.
func TestDialStopsAtShutdown(t *testing.T) {
	_, s := muxStream(t, "secret", "c1")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := lis.Addr().String()
	lis.Close()
	done := make(chan error, 1)
	go func() {
		_, err := s.Dial(raft.ServerAddress(refusing), time.Minute)
		done <- err
	}()
	s.stopDials()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial of an address that refuses connections: %v; want it cancelled", err)
	}
}
