package apitest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// H2Conn is a raw HTTP/2 client connection to a gRPC server in clear text,
// for tests of what the transport lets a client do: it writes the frames
// a gRPC client would (or a misbehaving one), and reads frames only when
// asked. It is not safe for concurrent use, except that one goroutine may
// read while another writes.
type H2Conn struct {
	Conn   net.Conn
	Framer *http2.Framer

	addr string
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	next uint32 // the next stream ID
}

// DialH2 connects to addr and writes the client preface and a SETTINGS
// frame with settings. It reads nothing.
func DialH2(addr string, settings ...http2.Setting) (*H2Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c := &H2Conn{Conn: conn, Framer: http2.NewFramer(conn, conn), addr: addr, next: 1}
	c.Framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		conn.Close()
		return nil, err
	}
	if err := c.Framer.WriteSettings(settings...); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the connection.
func (c *H2Conn) Close() error { return c.Conn.Close() }

// ServerSettings reads frames until the server's SETTINGS frame (not an
// acknowledgement) and returns its values, acknowledging it. It gives up
// after timeout.
func (c *H2Conn) ServerSettings(timeout time.Duration) (map[http2.SettingID]uint32, error) {
	c.Conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.Conn.SetReadDeadline(time.Time{})
	for {
		f, err := c.Framer.ReadFrame()
		if err != nil {
			return nil, err
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		got := map[http2.SettingID]uint32{}
		sf.ForeachSetting(func(s http2.Setting) error {
			got[s.ID] = s.Val
			return nil
		})
		return got, c.Framer.WriteSettingsAck()
	}
}

// GRPCMessage is msg as the body of a gRPC call: uncompressed, with its
// length.
func GRPCMessage(msg proto.Message) ([]byte, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...), nil
}

// Call starts a unary call of method (as "/package.Service/Method") with
// body (see GRPCMessage) and ends the client's side of it: a HEADERS
// frame, then a DATA frame that ends the stream. It returns the stream's
// ID.
func (c *H2Conn) Call(method string, body []byte) (uint32, error) {
	id := c.next
	c.next += 2
	c.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", c.addr},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return 0, err
		}
	}
	if err := c.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return id, err
	}
	return id, c.Framer.WriteData(id, true, body)
}

// Closed reads frames until the server closes the connection, answering
// its PINGs when ack is set, and returns the frames' types in order (a
// GOAWAY's error code as "GOAWAY(code)"). It fails if the connection is
// still open after timeout.
func (c *H2Conn) Closed(timeout time.Duration, ack bool) ([]string, error) {
	c.Conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.Conn.SetReadDeadline(time.Time{})
	var seen []string
	for {
		f, err := c.Framer.ReadFrame()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return seen, fmt.Errorf("still open after %v, having sent %v", timeout, seen)
			}
			return seen, nil
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			seen = append(seen, fmt.Sprintf("GOAWAY(%v)", f.ErrCode))
		case *http2.PingFrame:
			seen = append(seen, "PING")
			if ack && !f.IsAck() {
				if err := c.Framer.WritePing(true, f.Data); err != nil {
					return seen, nil
				}
			}
		default:
			seen = append(seen, f.Header().Type.String())
		}
	}
}
