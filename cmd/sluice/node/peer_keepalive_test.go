package node

import (
	"testing"
	"time"
)

// TestPeerKeepaliveAccepted: the listener of the peer service never
// disconnects the peers for their keepalive pings, whatever
// --keepalive-min-time says: it accepts pings at the peers' interval.
func TestPeerKeepaliveAccepted(t *testing.T) {
	for _, minTime := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, time.Minute} {
		if got := peerKeepaliveMinTime(Config{KeepaliveMinTime: minTime}); got > peerKeepalive.Time {
			t.Errorf("--keepalive-min-time %v: the peer listener accepts pings every %v at most; the peers ping every %v", minTime, got, peerKeepalive.Time)
		}
	}
}
