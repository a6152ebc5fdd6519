//go:build unix

package node

import (
	"io"
	"net"
	"syscall"

	"google.golang.org/grpc/mem"
)

// pollingConn lets gRPC read a bounded connection as it reads a bare TCP
// connection: gRPC takes a read buffer from its pool only once data has
// arrived, so that an idle connection pins none. gRPC does so for a
// connection whose type it knows (*net.TCPConn) or that has this
// ReadOnReady method (grpc internal/transport/readyreader.Reader);
// without it, it gives each wrapped connection a read buffer of its own
// (32 KiB, measured: 42 KB of heap per idle connection instead of 10).
type pollingConn struct {
	*limitConn
	raw syscall.RawConn

	// The state of one read, kept here so that read allocates nothing.
	bufSize int
	pool    mem.BufferPool
	buf     *[]byte
	n       int
	err     error
	read    func(fd uintptr) bool
}

// newConn wraps c, accepted by l, to give its slot back when closed.
func newConn(c net.Conn, l *limitListener) net.Conn {
	lc := &limitConn{Conn: c, l: l}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return lc
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return lc
	}
	p := &pollingConn{limitConn: lc, raw: raw}
	p.read = p.readFD
	return p
}

// ReadOnReady waits until the connection is readable, then reads up to
// bufSize bytes into a buffer from pool, which the caller puts back.
func (p *pollingConn) ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	p.bufSize, p.pool = bufSize, pool
	err := p.raw.Read(p.read)
	buf, n, rerr := p.buf, p.n, p.err
	p.buf, p.pool, p.err = nil, nil, nil
	if err == nil {
		err = rerr
	}
	switch {
	case err != nil:
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case n == 0:
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

// readFD reads from fd once it is readable; false asks the runtime to wait
// until it is.
func (p *pollingConn) readFD(fd uintptr) bool {
	buf := p.pool.Get(p.bufSize)
	n, err := syscall.Read(int(fd), *buf)
	for err == syscall.EINTR {
		n, err = syscall.Read(int(fd), *buf)
	}
	if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK {
		p.pool.Put(buf)
		return false
	}
	if err != nil {
		p.pool.Put(buf)
		p.n, p.err = 0, err
		return true
	}
	p.buf, p.n, p.err = buf, n, nil
	return true
}
