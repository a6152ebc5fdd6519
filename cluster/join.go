package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Join contacts the members listed in entries ("host:port", or "host" for
// this node's gossip port) until this node is in a cluster with at least
// one other live member, or ctx ends, or the membership shuts down. Each
// attempt resolves the names again (a Kubernetes headless Service lists the
// pods that exist now) and contacts every address; failed attempts are
// logged with the error of each address, and retried after a backoff from
// Config.JoinBackoffMin doubling up to Config.JoinBackoffMax. Addresses of
// this node itself are skipped; a list that names only this node succeeds
// at once, leaving this node as a new cluster of one. Start calls Join with
// Config.Join.
func (m *Membership) Join(ctx context.Context, entries []string) error {
	m.life.Lock()
	err := m.runningLocked()
	ml := m.ml
	m.life.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()

	backoff := m.cfg.JoinBackoffMin
	for attempt := 1; ; attempt++ {
		err := m.joinOnce(ctx, ml, entries)
		m.obs.JoinAttempt(err)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			if m.ctx.Err() != nil {
				return ErrClosed
			}
			return fmt.Errorf("%w %s: gave up after %d attempts: %v", ErrJoin, strings.Join(entries, ","), attempt, err)
		}
		// Jitter of ±20% keeps nodes started together from retrying in step.
		wait := time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64()))
		m.log.Warn("join attempt failed", "attempt", attempt, "join", entries, "err", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			if m.ctx.Err() != nil {
				return ErrClosed
			}
			return fmt.Errorf("%w %s: gave up after %d attempts: %v", ErrJoin, strings.Join(entries, ","), attempt, err)
		case <-time.After(wait):
		}
		backoff = min(2*backoff, m.cfg.JoinBackoffMax)
	}
}

// joinOnce makes one attempt: nil when this node ends up in a cluster with
// another live member, or when the list names only this node.
func (m *Membership) joinOnce(ctx context.Context, ml *memberlist.Memberlist, entries []string) error {
	if ml.NumMembers() > 1 {
		return nil // someone joined us meanwhile
	}
	targets, self, failures := m.resolve(ctx, entries)
	if len(targets) == 0 && len(failures) == 0 && self > 0 {
		m.log.Info("the join list names only this node: starting a new cluster", "join", entries)
		return nil
	}
	contacted := 0
	for _, t := range targets {
		if ctx.Err() != nil {
			failures = append(failures, ctx.Err().Error())
			break
		}
		if _, err := ml.Join([]string{t}); err != nil {
			failures = append(failures, flatten(err))
			continue
		}
		contacted++
	}
	if n := ml.NumMembers(); n > 1 {
		if len(failures) > 0 {
			m.log.Info("some join addresses failed", "errs", strings.Join(failures, "; "))
		}
		m.log.Info("joined the cluster", "contacted", contacted, "members", n)
		return nil
	}
	if len(targets) == 0 && len(failures) == 0 {
		return errors.New("the join list resolved to no address")
	}
	if contacted > 0 {
		failures = append(failures, fmt.Sprintf("%d addresses answered but no other member is alive", contacted))
	}
	return errors.New(strings.Join(failures, "; "))
}

// resolve turns join entries into distinct IP:port targets other than this
// node. self counts the addresses that were this node; failures lists the
// names that did not resolve.
func (m *Membership) resolve(ctx context.Context, entries []string) (targets []string, self int, failures []string) {
	seen := make(map[string]bool)
	for _, e := range entries {
		host, port, err := joinHostPort(e, m.self.port)
		if err != nil {
			failures = append(failures, fmt.Sprintf("join %q: %v", e, err))
			continue
		}
		var ips []net.IP
		if ip := net.ParseIP(host); ip != nil {
			ips = []net.IP{ip}
		} else {
			addrs, err := m.lookupIP(ctx, host)
			if err != nil {
				failures = append(failures, fmt.Sprintf("resolve %s: %v", host, err))
				continue
			}
			for _, a := range addrs {
				ips = append(ips, a.IP)
			}
		}
		for _, ip := range ips {
			addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
			if seen[addr] {
				continue
			}
			seen[addr] = true
			if m.self.is(ip, port) {
				self++
				continue
			}
			targets = append(targets, addr)
		}
	}
	return targets, self, failures
}

// rejoinUrgent is how often the rejoin loop runs while fewer members than
// expected are alive.
const rejoinUrgent = time.Second

// rejoinLoop contacts the join addresses and the gossip addresses of the
// cluster map's members (SetKnown) that are not live members of the view: nodes that
// started alone at the same time (each seeing only itself in DNS), the
// members a restarted node knew before (its join list may name only
// itself), or the other side of a partition that outlived memberlist's
// gossip to dead nodes. It does so every RejoinInterval, and every second
// while fewer than Config.Expect members are alive: a new cluster
// bootstraps only once Expect nodes found one another, and a node cut off
// from the Raft leader decides nothing, so finding the others is urgent.
func (m *Membership) rejoinLoop(ctx context.Context, ml *memberlist.Memberlist) {
	defer m.wg.Done()
	for {
		wait := m.cfg.RejoinInterval
		if m.View().Len() < m.cfg.Expect {
			wait = min(wait, rejoinUrgent)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		targets, _, failures := m.resolve(ctx, m.cfg.Join)
		live := make(map[string]bool)
		for _, mem := range m.View().Members {
			live[mem.Name] = true
			live[mem.GossipAddr] = true
		}
		targets = append(targets, m.knownAddrs()...)
		contacted := make(map[string]bool)
		for _, addr := range targets {
			if live[addr] || contacted[addr] || ctx.Err() != nil {
				continue
			}
			contacted[addr] = true
			before := m.Epoch()
			if _, err := ml.Join([]string{addr}); err != nil {
				failures = append(failures, flatten(err))
				continue
			}
			m.log.Debug("rejoin: contacted an address outside the view", "addr", addr,
				"view_changed", m.Epoch() != before)
		}
		if len(failures) > 0 {
			m.log.Debug("rejoin: some addresses failed", "errs", strings.Join(failures, "; "))
		}
	}
}

// selfAddrs recognises this node's own gossip address in a join list.
type selfAddrs struct {
	port      int
	advertise net.IP
	bind      net.IP
	hostIPs   []net.IP // this host's addresses, when bound to all of them
}

func newSelfAddrs(local *memberlist.Node, gossipAddr string) selfAddrs {
	bind, _, _ := splitIPPort(gossipAddr, true)
	s := selfAddrs{port: int(local.Port), advertise: local.Addr, bind: bind}
	if bind.IsUnspecified() {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok {
					s.hostIPs = append(s.hostIPs, ipn.IP)
				}
			}
		}
	}
	return s
}

// is reports whether ip:port reaches this node's gossip. Nodes on one host
// differ by port: "localhost" (127.0.0.1 or ::1) with this node's port is
// this node when it listens on localhost.
func (s selfAddrs) is(ip net.IP, port int) bool {
	if port != s.port {
		return false
	}
	if ip.Equal(s.advertise) || ip.Equal(s.bind) {
		return true
	}
	if isLocalhost(ip) && isLocalhost(s.bind) {
		return true
	}
	for _, h := range s.hostIPs {
		if ip.Equal(h) {
			return true
		}
	}
	return false
}

func isLocalhost(ip net.IP) bool {
	return ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback)
}

// flatten returns memberlist's multi-error as one line.
func flatten(err error) string {
	if w, ok := err.(interface{ WrappedErrors() []error }); ok {
		parts := make([]string, 0, len(w.WrappedErrors()))
		for _, e := range w.WrappedErrors() {
			parts = append(parts, e.Error())
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}
