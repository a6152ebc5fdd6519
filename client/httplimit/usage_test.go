package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client/httplimit"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestResponseCost: a rule with a response cost lets a request through
// while its budget is below the limit, and records the cost its response
// reported (a header, or a trailer sent after the body) once the handler
// returned, even over the limit; the requests after an overshoot get 429
// until the window has room. A missing cost records nothing; an
// unreadable one is reported to ObserveUsage as an error.
func TestResponseCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		cost httplimit.ResponseCost
		set  func(w http.ResponseWriter, tokens string)
	}{
		{"header", httplimit.ResponseHeader("X-Tokens-Used"), func(w http.ResponseWriter, tokens string) {
			w.Header().Set("X-Tokens-Used", tokens)
			w.WriteHeader(200)
		}},
		{"trailer", httplimit.ResponseTrailer("X-Tokens-Used"), func(w http.ResponseWriter, tokens string) {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(200)
			w.Write([]byte("streamed answer"))
			w.Header().Set("X-Tokens-Used", tokens)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodetest.Start(t, "n1", nil)
			var mu sync.Mutex
			var reports []httplimit.UsageReport
			l, err := httplimit.New(httplimit.Config{
				Client: newClient(t, n.Addr, nil),
				Rules: []httplimit.Rule{{Name: "tokens", Key: httplimit.Header("X-User"), Limit: 1000, Window: time.Minute,
					ResponseCost: tc.cost}},
				ObserveUsage: func(rep *httplimit.UsageReport) {
					mu.Lock()
					defer mu.Unlock()
					reports = append(reports, *rep)
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(l.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tc.set(w, r.URL.Query().Get("tokens"))
			})))
			t.Cleanup(srv.Close)
			for i, step := range []struct {
				tokens string
				want   int
			}{
				{"900", 200},
				{"", 200},      // no cost: nothing recorded
				{"bogus", 200}, // unreadable: nothing recorded, an error
				{"500", 200},   // 900 < 1000: through; spends 500 (1400)
				{"1", 429},     // over the budget
			} {
				got := do(t, "GET", srv.URL+"/?tokens="+step.tokens, map[string]string{"X-User": "u1"}, "")
				if got.status != step.want {
					t.Fatalf("request %d (tokens %q) = %d; want %d", i, step.tokens, got.status, step.want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			var costs []string
			for _, r := range reports {
				s := strconv.FormatInt(r.Cost, 10)
				if r.Err != nil {
					s = "error"
				} else if r.Cost > 0 && !r.Decision.Allowed {
					s += " over"
				}
				costs = append(costs, s)
			}
			if got, want := costs, []string{"900", "0", "error", "500 over"}; !equal(got, want) {
				t.Errorf("reports %v; want %v", got, want)
			}
		})
	}
	if _, err := httplimit.New(httplimit.Config{Client: newClient(t, "127.0.0.1:1", nil), Rules: []httplimit.Rule{{
		Name: "x", Key: httplimit.ClientIP(), Limit: 10, Window: time.Minute, Cost: 2, ResponseCost: httplimit.ResponseHeader("X"),
	}}}); err == nil {
		t.Error("New(a rule with a cost and a response cost) = nil; want an error")
	}
	for _, spec := range []string{"response-header:", "header:X", "response-trailer:a b", ""} {
		if _, err := httplimit.ParseResponseCost(spec); err == nil {
			t.Errorf("ParseResponseCost(%q) = nil error; want one", spec)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
