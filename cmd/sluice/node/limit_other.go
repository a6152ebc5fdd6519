//go:build !unix

package node

import "net"

// newConn wraps c, accepted by l, to give its slot back when closed.
func newConn(c net.Conn, l *limitListener) net.Conn { return &limitConn{Conn: c, l: l} }
