package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// requestBudget bounds the bytes of requests that the node works on at
// once: node-wide, and per connection. A call takes its request's size in
// bytes (as received, before decoding) from its connection's budget, then
// from the node's, before its request is decoded, and gives them back when
// its handler returns. A call that does not fit waits, holding only the
// bytes it was sent, until its deadline or BudgetWait, whichever is
// sooner, and is then refused with RESOURCE_EXHAUSTED; nothing of it was
// decided. A request larger than a budget takes all of it.
//
// What a call costs the node while it is worked on (its decoded request,
// the engine's checks and decisions, the answer) is a multiple of its
// request's size, so bounding the bytes bounds that memory, whatever the
// number of connections and streams: see docs/operations.md ("Request
// bytes in flight") for the figures. Only the decision services (native
// and Envoy) are budgeted. Not the admin services, so that an operator can
// look at keys and set overrides while decisions wait; not the peer
// service: a forwarded call holds a budget on the node that forwards it,
// and a budget on the owner too could make two nodes wait on each other.
type requestBudget struct {
	node    *semaphore.Weighted
	nodeMax int64
	connMax int64
	wait    time.Duration
	mu      sync.Mutex
	conns   map[connKey]*connBudget
	idle    int // entries of conns with no call
	waited  prometheus.Counter
	refused prometheus.Counter
	bytes   atomic.Int64 // taken from the node (sluice_request_bytes_in_flight)
}

// connKey names a connection by its two ends, without formatting them
// (a call's cost): the TCP addresses' bytes, or their strings for other
// networks.
type connKey struct {
	remote, local   [16]byte
	rport, lport    int
	remoteS, localS string
}

func keyOf(ctx context.Context) connKey {
	var k connKey
	p, ok := peer.FromContext(ctx)
	if !ok {
		return k
	}
	end := func(a net.Addr, ip *[16]byte, port *int, str *string) {
		if t, ok := a.(*net.TCPAddr); ok {
			copy(ip[:], t.IP.To16())
			*port = t.Port
		} else if a != nil {
			*str = a.String()
		}
	}
	end(p.Addr, &k.remote, &k.rport, &k.remoteS)
	end(p.LocalAddr, &k.local, &k.lport, &k.localS)
	return k
}

type connBudget struct {
	sem   *semaphore.Weighted
	users int // calls holding or waiting for it; removed at 0
}

func newRequestBudget(nodeMax, connMax int64, wait time.Duration, reg prometheus.Registerer) *requestBudget {
	b := &requestBudget{
		node: semaphore.NewWeighted(nodeMax), nodeMax: nodeMax, connMax: connMax, wait: wait,
		conns: make(map[connKey]*connBudget),
		waited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_request_budget_waits_total",
			Help: "Calls that waited for request bytes in flight (--max-inflight-bytes, --max-conn-inflight-bytes) before being worked on.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_request_budget_refused_total",
			Help: "Calls refused with RESOURCE_EXHAUSTED because the request bytes in flight stayed at their bound for --budget-wait or the call's deadline.",
		}),
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_request_bytes_in_flight",
		Help: "Bytes of the requests the node works on now (decision calls, native and Envoy), bounded by --max-inflight-bytes.",
	}, func() float64 { return float64(b.bytes.Load()) })
	reg.MustRegister(b.waited, b.refused, inflight)
	return b
}

// wrap returns desc with each unary method's handler taking the budget
// around the decoding and handling of its request.
func (b *requestBudget) wrap(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i := range d.Methods {
		d.Methods[i].Handler = b.handler(d.Methods[i].Handler)
	}
	return &d
}

// rawRequest is a request received but not decoded: requestCodec keeps
// its bytes (with a reference, released by Free) for the budget's handler.
type rawRequest struct {
	data  mem.BufferSlice
	codec requestCodec
}

func (b *requestBudget) handler(h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		var raw rawRequest
		if err := dec(&raw); err != nil {
			return nil, err
		}
		if raw.data == nil { // not through requestCodec: no budget to take
			return h(srv, ctx, dec, ic)
		}
		defer raw.data.Free()
		hold, err := b.acquire(ctx, int64(raw.data.Len()))
		if err != nil {
			return nil, err
		}
		defer hold.release()
		return h(srv, ctx, func(v any) error { return raw.codec.Unmarshal(raw.data, v) }, ic)
	}
}

// acquire takes n bytes from the connection of ctx, then from the node,
// waiting as the type's comment says; the hold gives them back.
func (b *requestBudget) acquire(ctx context.Context, n int64) (budgetHold, error) {
	n = max(n, 1)
	key := keyOf(ctx)
	b.mu.Lock()
	cb := b.conns[key]
	switch {
	case cb == nil:
		cb = &connBudget{sem: semaphore.NewWeighted(b.connMax)}
		b.conns[key] = cb
	case cb.users == 0:
		b.idle--
	}
	cb.users++
	b.mu.Unlock()
	h := budgetHold{b: b, cb: cb, key: key, nc: min(n, b.connMax)}
	h.nn = min(h.nc, b.nodeMax)
	if !cb.sem.TryAcquire(h.nc) || !b.tryNode(h.nn, cb, h.nc) {
		b.waited.Inc()
		wctx, cancel := context.WithTimeout(ctx, b.wait)
		err := b.waitFor(wctx, cb, h.nc, h.nn)
		cancel()
		if err != nil {
			h.leave()
			if errors.Is(ctx.Err(), context.Canceled) {
				return budgetHold{}, status.FromContextError(ctx.Err()).Err()
			}
			b.refused.Inc()
			return budgetHold{}, status.Errorf(codes.ResourceExhausted, "sluice: the node is working on its most request bytes at once (%d on this connection, %d in all: --max-conn-inflight-bytes, --max-inflight-bytes); this call of %d bytes waited %v and was not decided; retry with backoff", b.connMax, b.nodeMax, n, b.wait)
		}
	}
	b.bytes.Add(h.nn)
	return h, nil
}

// budgetHold is what a call took from a budget.
type budgetHold struct {
	b      *requestBudget
	cb     *connBudget
	key    connKey
	nc, nn int64 // bytes taken from the connection and from the node
}

// release gives the bytes back.
func (h budgetHold) release() {
	h.b.bytes.Add(-h.nn)
	h.b.node.Release(h.nn)
	h.cb.sem.Release(h.nc)
	h.leave()
}

// leave ends the call's use of its connection's budget. A connection's
// entry outlives its last call, for the next one (a connection usually has
// one call at a time: making an entry for each would cost two allocations
// a call); once more than idleConnEntries entries have no call, those are
// dropped.
func (h budgetHold) leave() {
	b := h.b
	b.mu.Lock()
	if h.cb.users--; h.cb.users == 0 {
		if b.idle++; b.idle > idleConnEntries {
			for k, cb := range b.conns {
				if cb.users == 0 {
					delete(b.conns, k)
				}
			}
			b.idle = 0
		}
	}
	b.mu.Unlock()
}

// idleConnEntries bounds the connection entries kept with no call.
const idleConnEntries = 1024

// tryNode takes nn bytes from the node without waiting; if it cannot, it
// gives back the nc bytes taken from cb.
func (b *requestBudget) tryNode(nn int64, cb *connBudget, nc int64) bool {
	if b.node.TryAcquire(nn) {
		return true
	}
	cb.sem.Release(nc)
	return false
}

// waitFor takes nc bytes from cb, then nn from the node, waiting until ctx
// ends.
func (b *requestBudget) waitFor(ctx context.Context, cb *connBudget, nc, nn int64) error {
	if err := cb.sem.Acquire(ctx, nc); err != nil {
		return err
	}
	if err := b.node.Acquire(ctx, nn); err != nil {
		cb.sem.Release(nc)
		return fmt.Errorf("node budget: %w", err)
	}
	return nil
}
