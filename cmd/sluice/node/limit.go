package node

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener holds at most max connections open at once: Accept takes
// a new connection only once one of them closed, so past the bound new
// connections wait in the kernel's accept queue (their TCP handshake
// done, nothing read or answered) and are served in turn. What a node
// holds per connection is then bounded by configuration.
type limitListener struct {
	net.Listener
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once

	open    prometheus.Gauge   // connections held
	waits   prometheus.Counter // Accepts that found every slot taken
	log     *slog.Logger
	lastLog atomic.Int64 // Unix nanoseconds of the last "limit reached" line
}

// newLimitListener bounds l to max connections, reporting under the
// listener label name.
func newLimitListener(l net.Listener, max int, name string, m *metrics, log *slog.Logger) *limitListener {
	return &limitListener{
		Listener: l,
		slots:    make(chan struct{}, max),
		closed:   make(chan struct{}),
		open:     m.connections.WithLabelValues(name),
		waits:    m.connectionWaits.WithLabelValues(name),
		log:      log.With("listener", name, "max_connections", max),
	}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		l.waits.Inc()
		if now := time.Now().UnixNano(); now-l.lastLog.Load() > int64(time.Minute) {
			l.lastLog.Store(now)
			l.log.Warn("connection limit reached: new connections wait until one closes (see --max-connections)")
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Inc()
	return newConn(c, l), nil
}

// Close closes the listener and ends an Accept that waits for a slot.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its slot back when it is closed, once.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Dec()
		<-c.l.slots
	})
	return err
}
