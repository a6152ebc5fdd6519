// Package clustertest holds what the tests of clustered nodes need in every
// package that runs them (cluster, api, cmd/sluice): gossip ports and a
// goroutine leak check that allows for memberlist's shutdown.
package clustertest

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// FreePort returns a port that was free for both TCP and UDP on every one of
// ips (127.0.0.1 if none) a moment ago: memberlist needs both on the same
// number.
func FreePort(t testing.TB, ips ...string) int {
	t.Helper()
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	for range 100 {
		// Below the kernel's ephemeral range (32768 and up by default):
		// a port picked by the kernel for a ":0" listener or an outgoing
		// connection elsewhere in the tests can never take it between
		// this check and the node's bind, as it could take a freed
		// ephemeral one.
		port := 20000 + rand.IntN(12000)
		tl, err := net.Listen("tcp", net.JoinHostPort(ips[0], strconv.Itoa(port)))
		if err != nil {
			continue
		}
		free := true
		var held []io.Closer
		for i, ip := range ips {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			if i > 0 {
				l, err := net.Listen("tcp", addr)
				if err != nil {
					free = false
					break
				}
				held = append(held, l)
			}
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				free = false
				break
			}
			held = append(held, u)
		}
		tl.Close()
		for _, c := range held {
			c.Close()
		}
		if free {
			return port
		}
	}
	t.Fatalf("no port free for TCP and UDP on %v", ips)
	return 0
}

// Run runs the tests of m and, if they pass, checks that no goroutine
// outlives them, and returns the exit code. memberlist's Shutdown does not
// wait for a probe in flight, which ends within one (possibly scaled) probe
// interval, so the check polls for up to 10 s. Idle connections of
// http.DefaultClient are closed first.
func Run(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := testkit.Wait(10*time.Second, func() error {
		// Keep-alive connections that tests' http.Get left idle in the
		// default transport are the client's, not a leak of the code
		// under test.
		http.DefaultClient.CloseIdleConnections()
		return goleak.Find()
	}); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// RunParallel is Run for a package whose tests wait more than they
// compute (elections, leases, processes starting up): unless the command
// line sets -test.parallel, up to n of its parallel tests run at once
// instead of GOMAXPROCS, so that their waits overlap.
func RunParallel(m *testing.M, n int) int {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
	return Run(m)
}
