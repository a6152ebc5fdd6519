//go:build linux

package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// requireNetns skips the test, with one line saying why, unless this
// process can create network namespaces with ip: it must run as root, find
// ip, and succeed in adding (then deleting) a namespace. With CI set, the
// test fails with that line instead of skipping: CI runs as root and
// .ci/run installs ip. -short skips it even then, as asked.
func requireNetns(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("faults: runs three-node clusters for minutes; skipped with -short")
	}
	missing := t.Skip
	if os.Getenv("CI") != "" {
		missing = t.Fatal
	}
	if os.Geteuid() != 0 {
		missing("faults: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		missing("faults: needs ip (iproute2) to create network namespaces")
	}
	if _, err := exec.LookPath("tc"); err != nil {
		missing("faults: needs tc (iproute2) to slow a node's link")
	}
	probe := randomPrefix() + "pr"
	if err := ip("netns", "add", probe); err != nil {
		missing(fmt.Sprintf("faults: cannot create a network namespace: %v", err))
	}
	if err := ip("netns", "del", probe); err != nil {
		t.Fatalf("delete the probe namespace: %v", err)
	}
}

// ip runs the ip command with args and returns an error holding its output
// if it fails.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// randomPrefix returns "sf" and four random lowercase letters or digits:
// the start of every namespace and interface name of one network, short
// enough that an interface name stays within 15 bytes.
func randomPrefix() string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte("sf")
	for range 4 {
		b = append(b, chars[rand.IntN(len(chars))])
	}
	return string(b)
}

// network is a private IPv4 network of namespaces: a switch namespace
// holding a bridge, and one namespace per host, linked to the bridge by a
// veth pair. Nothing of it lives in the root namespace.
type network struct {
	prefix string  // start of every name
	subnet string  // "10.x.y.", the /24 of the hosts
	sw     string  // the switch namespace
	hosts  []*host // in order: hosts[0] is "n1"
}

// host is one namespace of a network.
type host struct {
	ns     string // namespace name, under /run/netns
	ifname string // its end of the veth pair
	ip     string // its address on the network
	// ip2 is a second address on the same link, used by nothing but what
	// the scenario binds to it (the peer service), so that it can be cut
	// while ip, and gossip on it, still work.
	ip2   string
	peers []*host
	// sw and port are the switch namespace and h's port on its bridge:
	// the other end of ifname.
	sw, port string
}

// newNetwork creates a network of n hosts, each with loopback and its link
// up and two addresses, on a random 10.x.y.0/24. The test's end deletes
// every namespace (and with them the links and the bridge). It fails the
// test if a namespace cannot be created.
func newNetwork(t *testing.T, n int) *network {
	t.Helper()
	nw := &network{
		prefix: randomPrefix(),
		subnet: fmt.Sprintf("10.%d.%d.", 100+rand.IntN(150), rand.IntN(256)),
	}
	nw.sw = nw.prefix + "sw"
	var created []string
	t.Cleanup(func() {
		for _, ns := range created {
			if err := ip("netns", "del", ns); err != nil {
				t.Errorf("delete namespace: %v", err)
			}
		}
	})
	addNS := func(ns string) {
		t.Helper()
		if err := ip("netns", "add", ns); err != nil {
			t.Fatalf("create the namespaces: %v", err)
		}
		created = append(created, ns)
	}
	must := func(args ...string) {
		t.Helper()
		if err := ip(args...); err != nil {
			t.Fatalf("set up the network: %v", err)
		}
	}
	addNS(nw.sw)
	must("-n", nw.sw, "link", "add", "br0", "type", "bridge")
	must("-n", nw.sw, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		h := &host{
			ns:     fmt.Sprintf("%sn%d", nw.prefix, i),
			ifname: fmt.Sprintf("%sv%d", nw.prefix, i),
			ip:     fmt.Sprintf("%s%d", nw.subnet, 10+i),
			ip2:    fmt.Sprintf("%s%d", nw.subnet, 110+i),
			sw:     nw.sw,
			port:   fmt.Sprintf("%sp%d", nw.prefix, i),
		}
		port := h.port
		addNS(h.ns)
		must("link", "add", h.ifname, "netns", h.ns, "type", "veth", "peer", "name", port, "netns", nw.sw)
		must("-n", nw.sw, "link", "set", port, "master", "br0", "up")
		must("-n", h.ns, "addr", "add", h.ip+"/24", "dev", h.ifname)
		// The second address is /32: the first stays the source of
		// everything the host sends.
		must("-n", h.ns, "addr", "add", h.ip2+"/32", "dev", h.ifname)
		must("-n", h.ns, "link", "set", "lo", "up")
		must("-n", h.ns, "link", "set", h.ifname, "up")
		nw.hosts = append(nw.hosts, h)
	}
	for _, h := range nw.hosts {
		for _, p := range nw.hosts {
			if p != h {
				h.peers = append(h.peers, p)
			}
		}
	}
	return nw
}

// setLink brings h's link to the bridge up or down: down cuts h off from
// every other host (a full partition) while its loopback keeps working.
func (h *host) setLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ip("-n", h.ns, "link", "set", "dev", h.ifname, state)
}

// blackhole adds (or with add false, removes) a blackhole route for to's
// address in every other host's namespace: they drop whatever they send to
// it, while what it sends them still arrives. A one-way cut.
func (to *host) blackhole(add bool) error {
	return blackholeRoutes(to.peers, []string{to.ip}, add)
}

// blackholeSecond is blackhole for to's second address only: the others
// can no longer reach what listens there, and everything else, gossip on
// the first address included, still flows both ways.
func (to *host) blackholeSecond(add bool) error {
	return blackholeRoutes(to.peers, []string{to.ip2}, add)
}

// cutBetween adds (or removes) blackhole routes both ways between the
// hosts of a and those of b, for both addresses: a group cut off from the
// rest, whose members still reach each other (a zone of the network).
func cutBetween(a, b []*host, add bool) error {
	addrs := func(hs []*host) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.ip, h.ip2)
		}
		return out
	}
	return errors.Join(blackholeRoutes(a, addrs(b), add), blackholeRoutes(b, addrs(a), add))
}

// blackholeRoutes adds (or removes) a blackhole route for each address of
// to in each namespace of from.
func blackholeRoutes(from []*host, to []string, add bool) error {
	verb := "del"
	if add {
		verb = "add"
	}
	var errs []error
	for _, h := range from {
		for _, addr := range to {
			errs = append(errs, ip("-n", h.ns, "route", verb, "blackhole", addr+"/32"))
		}
	}
	return errors.Join(errs...)
}

// dial connects to addr over TCP from inside h's namespace, as a process
// of that namespace would. The socket stays in that namespace for its whole
// life, whatever thread later uses it.
func (h *host) dial(ctx context.Context, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// Only this goroutine's thread enters the namespace. If it cannot
		// go back, the thread stays locked and ends with the goroutine, so
		// no other goroutine ever runs in the wrong namespace.
		runtime.LockOSThread()
		conn, restored, err := dialInNamespace(ctx, h.ns, addr)
		if restored {
			runtime.UnlockOSThread()
		}
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialInNamespace switches the calling thread, which must be locked, into
// the network namespace ns, dials addr, and switches back. restored reports
// whether the thread is back in its own namespace.
func dialInNamespace(ctx context.Context, ns, addr string) (conn net.Conn, restored bool, err error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return nil, true, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("enter namespace %s: %w", ns, err)
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, "tcp", addr)
	if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, false, fmt.Errorf("leave namespace %s: %w", ns, serr)
	}
	if err != nil {
		return nil, true, fmt.Errorf("in namespace %s: %w", ns, err)
	}
	return conn, true, nil
}
