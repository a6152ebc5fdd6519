package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice/actor/clock"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// These tests play an AI gateway in front of Sluice over the wire (real
// gRPC on 127.0.0.1, real bbolt files, the nodes' fake clock): token
// budgets per user, spent by many concurrent requests whose cost is known
// only once their response is done.

// Budget test parameters: per-user budgets of budgetLimit tokens a minute,
// budgetCallers concurrent requests per user, each costing up to
// budgetMaxCost tokens.
const (
	budgetUsers   = 6
	budgetCallers = 4
	budgetLimit   = 5000
	budgetMaxCost = 800
	budgetWindow  = time.Minute
	budgetRounds  = 9
	budgetStep    = 10 * time.Second
)

// spend is tokens spent (reported, or settled) at a time.
type spend struct {
	at     time.Time
	tokens int64
}

// budgetBed is what a budget test runs against: the nodes' connections
// and their shared fake clock.
type budgetBed struct {
	conns []*grpc.ClientConn
	clk   *clock.Fake
}

func singleBed(t *testing.T) budgetBed {
	ts := newTestServer(t, func(c *Config) { c.UsageDomains = []string{"ai"} })
	return budgetBed{conns: []*grpc.ClientConn{ts.conn}, clk: ts.clk}
}

func clusterBed(t *testing.T) budgetBed {
	tc := newTestClusterWith(t, 3, func(c *Config) { c.UsageDomains = []string{"ai"} })
	b := budgetBed{clk: tc.clk}
	for _, ts := range tc.nodes {
		b.conns = append(b.conns, ts.conn)
	}
	return b
}

// envoyBudget is the descriptor Envoy sends for user u: the inline limit
// of its route, and hits (0 on the request path; the tokens used on
// the response path, from apply_on_stream_done).
func envoyBudget(u int, hits uint64) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%d", u)}},
		Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: budgetLimit, Unit: 2 /* MINUTE */},
		HitsAddend: wrapperspb.UInt64(hits),
	}}}
}

func budgetCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// untilDecided makes call until a node decides it: a node that holds no
// lease (a CPU-starved cluster's lease lapsed) answers Unavailable, almost
// always before deciding anything, so the call is made again, until ctx
// ends. (Rarely a lease lapses while the call is decided: a retried
// report or reservation then counts twice, which only makes the node
// stricter than the test's ledger, and a settle made twice is reported as
// a failure; neither can hide a key over its limit.)
func untilDecided[T any](ctx context.Context, call func() (T, error)) (T, error) {
	for {
		resp, err := call()
		if status.Code(err) != codes.Unavailable {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return resp, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// shouldRateLimit sends req until a node decides it (untilDecided).
func shouldRateLimit(ctx context.Context, rls rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return untilDecided(ctx, func() (*rlsv3.RateLimitResponse, error) { return rls.ShouldRateLimit(ctx, req) })
}

// maxInWindow returns the most tokens spent within one window, over every
// interval of one window.
func maxInWindow(spends []spend) int64 {
	var most int64
	for i := range spends {
		var sum int64
		for _, s := range spends {
			if !s.at.Before(spends[i].at) && s.at.Before(spends[i].at.Add(budgetWindow)) {
				sum += s.tokens
			}
		}
		most = max(most, sum)
	}
	return most
}

// underAt returns the first time from now on at which the tokens spent
// within the window are below the limit, with nothing more spent.
func underAt(spends []spend, now time.Time) time.Time {
	used := func(t time.Time) (n int64) {
		for _, s := range spends {
			if t.Before(s.at.Add(budgetWindow)) && !t.Before(s.at) {
				n += s.tokens
			}
		}
		return n
	}
	if used(now) < budgetLimit {
		return now
	}
	for _, s := range spends { // capacity returns only when a spend leaves
		if t := s.at.Add(budgetWindow); t.After(now) && used(t) < budgetLimit {
			return t
		}
	}
	panic("never under")
}

// TestTokenBudgetEnvoy plays Envoy's token budgets: each request asks
// with hits_addend 0 whether its user's budget has room, and once its
// response is done reports the tokens it used (apply_on_stream_done), on
// a domain marked --usage-domain. Invariants: over any interval of one
// window, the tokens admitted for a user never exceed the limit plus one
// overshoot per concurrent request (each may have been admitted just
// under the limit); every report counts, so users who overshoot run out;
// and a user over budget is refused until exactly the moment the window
// has room again, and admitted from that nanosecond on.
func TestTokenBudgetEnvoy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bed  func(*testing.T) budgetBed
	}{
		{"one node", singleBed},
		{"three nodes", clusterBed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.bed(t)
			ctx := budgetCtx(t)
			var mu sync.Mutex
			spent := make([][]spend, budgetUsers)
			refused := 0
			for round := range budgetRounds {
				now := b.clk.Now()
				var wg sync.WaitGroup
				for u := range budgetUsers {
					for c := range budgetCallers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(round), uint64(u*budgetCallers+c)))
							rls := rlsv3.NewRateLimitServiceClient(b.conns[(u+c)%len(b.conns)])
							for range 6 {
								resp, err := shouldRateLimit(ctx, rls, envoyBudget(u, 0))
								if err != nil {
									t.Errorf("request path check of u%d: %v", u, err)
									return
								}
								if resp.OverallCode != rlsv3.RateLimitResponse_OK {
									mu.Lock()
									refused++
									mu.Unlock()
									return
								}
								tokens := 1 + rng.Int64N(budgetMaxCost)
								if _, err := shouldRateLimit(ctx, rls, envoyBudget(u, uint64(tokens))); err != nil {
									t.Errorf("usage report of u%d (%d tokens): %v", u, tokens, err)
									return
								}
								mu.Lock()
								spent[u] = append(spent[u], spend{now, tokens})
								mu.Unlock()
							}
						}()
					}
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				if round < budgetRounds-1 {
					b.clk.Advance(budgetStep)
				}
			}
			var total int64
			for u := range budgetUsers {
				most := maxInWindow(spent[u])
				if bound := int64(budgetLimit + budgetCallers*budgetMaxCost); most > bound {
					t.Errorf("u%d: %d tokens admitted within one window; want at most the limit plus one overshoot per caller, %d", u, most, bound)
				}
				for _, s := range spent[u] {
					total += s.tokens
				}
			}
			if refused == 0 || total < 2*budgetLimit*budgetUsers {
				t.Fatalf("%d tokens admitted, %d requests refused: the test did not drive users over their budgets", total, refused)
			}

			// A user over budget waits exactly until the window has room.
			type due struct {
				u  int
				at time.Time
			}
			var over []due
			for u := range budgetUsers {
				slices.SortFunc(spent[u], func(x, y spend) int { return x.at.Compare(y.at) })
				if at := underAt(spent[u], b.clk.Now()); at.After(b.clk.Now()) {
					over = append(over, due{u, at})
				}
			}
			if len(over) == 0 {
				t.Fatal("no user is over budget at the end: the test does not check the wait")
			}
			slices.SortFunc(over, func(x, y due) int { return x.at.Compare(y.at) })
			rls := rlsv3.NewRateLimitServiceClient(b.conns[0])
			ask := func(u int) rlsv3.RateLimitResponse_Code {
				t.Helper()
				resp, err := shouldRateLimit(ctx, rls, envoyBudget(u, 0))
				if err != nil {
					t.Fatalf("check of u%d: %v", u, err)
				}
				return resp.OverallCode
			}
			for i := 0; i < len(over); {
				// The users whose window has room at the same moment.
				j := i
				for j < len(over) && over[j].at.Equal(over[i].at) {
					j++
				}
				b.clk.Advance(over[i].at.Sub(b.clk.Now()) - 1)
				for _, o := range over[i:j] {
					if got := ask(o.u); got != rlsv3.RateLimitResponse_OVER_LIMIT {
						t.Errorf("u%d 1ns before its window has room (%v): %v; want OVER_LIMIT", o.u, o.at.Format(time.StampNano), got)
					}
				}
				b.clk.Advance(1)
				for _, o := range over[i:j] {
					if got := ask(o.u); got != rlsv3.RateLimitResponse_OK {
						t.Errorf("u%d when its window has room (%v): %v; want OK", o.u, o.at.Format(time.StampNano), got)
					}
				}
				i = j
			}
		})
	}
}

// TestTokenBudgetReserve plays a gateway that reserves each request's
// max_tokens, then settles with the tokens it used (never more), and
// abandons some requests without settling: over any interval of one
// window, the tokens a user's requests spent (settled cost, or the
// estimate of an abandoned one) never exceed the limit; a settle gives
// back the difference; a reservation settles once; expired reservations
// are settled at their estimate, and leave nothing behind.
func TestTokenBudgetReserve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bed  func(*testing.T) budgetBed
	}{
		{"one node", singleBed},
		{"three nodes", clusterBed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.bed(t)
			ctx := budgetCtx(t)
			var mu sync.Mutex
			spent := make([][]spend, budgetUsers)
			var settled, abandoned, denied int
			key := func(u int) []byte { return fmt.Appendf(nil, "ai|user=u%d", u) }
			for round := range budgetRounds {
				now := b.clk.Now()
				var wg sync.WaitGroup
				for u := range budgetUsers {
					for c := range budgetCallers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(round)+100, uint64(u*budgetCallers+c)))
							rl := sluicepb.NewRateLimitServiceClient(b.conns[(u+c)%len(b.conns)])
							for range 4 {
								est := 200 + rng.Int64N(budgetMaxCost)
								reserve := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{
									Key: key(u), Limit: budgetLimit, Window: durationpb.New(budgetWindow), Cost: &est,
									ReserveFor: durationpb.New(30 * time.Second),
								}}}
								resp, err := untilDecided(ctx, func() (*sluicepb.CheckResponse, error) { return rl.Check(ctx, reserve) })
								if err != nil {
									t.Errorf("reserve %d for u%d: %v", est, u, err)
									return
								}
								d := resp.Decisions[0]
								if !d.Allowed {
									if len(d.Reservation) != 0 {
										t.Errorf("a denied reserve carries a handle")
									}
									mu.Lock()
									denied++
									mu.Unlock()
									return
								}
								if rng.IntN(10) == 0 { // the request died: never settled
									mu.Lock()
									abandoned++
									spent[u] = append(spent[u], spend{now, est})
									mu.Unlock()
									continue
								}
								used := rng.Int64N(est + 1)
								settle := func(cost int64) (*sluicepb.SettleResponse, error) {
									return untilDecided(ctx, func() (*sluicepb.SettleResponse, error) {
										return rl.Settle(ctx, &sluicepb.SettleRequest{Settlements: []*sluicepb.Settlement{{Reservation: d.Reservation, Cost: cost}}})
									})
								}
								sr, err := settle(used)
								if err != nil {
									t.Errorf("settle of u%d: %v", u, err)
									return
								}
								if r := sr.Results[0]; !r.Settled || r.Returned != est-used || r.Overshoot != 0 {
									t.Errorf("settle %d of %d for u%d = %v; want settled, %d returned", used, est, u, r, est-used)
								}
								again, err := settle(0)
								if err != nil || again.Results[0].Settled {
									t.Errorf("second settle of one reservation = %v, %v; want not settled", again, err)
								}
								mu.Lock()
								settled++
								spent[u] = append(spent[u], spend{now, used})
								mu.Unlock()
							}
						}()
					}
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				b.clk.Advance(budgetStep)
			}
			for u := range budgetUsers {
				if most := maxInWindow(spent[u]); most > budgetLimit {
					t.Errorf("u%d: %d tokens spent within one window; want at most the limit, %d", u, most, budgetLimit)
				}
			}
			if settled == 0 || abandoned == 0 || denied == 0 {
				t.Fatalf("%d settled, %d abandoned, %d denied: the test did not exercise every path", settled, abandoned, denied)
			}
			// Past every reservation's expiry and every hit's window, the
			// keys hold nothing: expired reservations were settled at their
			// estimate, and left nothing behind.
			b.clk.Advance(budgetWindow)
			admin := sluicepb.NewAdminServiceClient(b.conns[0])
			for u := range budgetUsers {
				got, err := admin.GetKey(ctx, &sluicepb.GetKeyRequest{Key: key(u)})
				if err != nil {
					t.Fatal(err)
				}
				if st := got.State; st.Found || st.Reservations != 0 {
					t.Errorf("u%d a window after the last reservation expired: found %v, %d reservations; want nothing", u, st.Found, st.Reservations)
				}
			}
		})
	}
}
