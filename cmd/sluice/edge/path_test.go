package edge

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// normalisingOrigin is an origin that resolves paths as nginx and Python's
// http.server do (merged slashes, dot segments, decoded unreserved
// characters; case kept): it records the path each request reached.
type normalisingOrigin struct {
	url     string
	mu      sync.Mutex
	reached []string // "METHOD path" after the origin's own normalisation
	sent    []string // the path the edge sent
}

func newNormalisingOrigin(t *testing.T) *normalisingOrigin {
	o := &normalisingOrigin{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := path.Clean(r.URL.Path) // r.URL.Path has %2e decoded already
		o.mu.Lock()
		o.reached = append(o.reached, r.Method+" "+p)
		o.sent = append(o.sent, r.URL.EscapedPath())
		o.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	o.url = srv.URL
	return o
}

func (o *normalisingOrigin) count(what string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, r := range o.reached {
		if r == what {
			n++
		}
	}
	return n
}

// rawRequest sends method and target as they are (no client cleans them)
// and returns the status code.
func rawRequest(t *testing.T, addr, method, target string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, target, addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestPathCannotWalkAroundARule: with 2 POST /login an hour, the ways of
// writing /login that a normalising origin resolves to /login are held to
// the same rule (429 once it is spent), and the origin receives the
// normal path; a path origins read in different ways is refused with 400
// and reaches nothing. Case is kept by default (the origin serves /LOGIN
// as another resource); path_case_insensitive matches it for an origin
// that folds case. Before, //login, /./login and /x/../login fell through
// to the / route and reached /login on the origin.
func TestPathCannotWalkAroundARule(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	for _, fold := range []bool{false, true} {
		t.Run(fmt.Sprintf("path_case_insensitive=%v", fold), func(t *testing.T) {
			o := newNormalisingOrigin(t)
			rules := &RulesFile{Routes: []RouteSpec{
				{Name: "login", PathPrefix: "/login", Methods: []string{"POST"}, PathCaseInsensitive: fold,
					Rules: []RuleSpec{{Name: fmt.Sprintf("login_ip_%v", fold), Key: "ip", Limit: 2, Window: "1h"}}},
				{Name: "site", PathPrefix: "/"},
			}}
			e := startEdge(t, o.url, n.Addr, func(c *Config) { c.Rules = rules })
			for i, tt := range []struct {
				target string
				want   int
			}{
				{"/login", 200},
				{"/login", 200},
				{"/login", 429},
				{"//login", 429},
				{"/./login", 429},
				{"/x/../login", 429},
				{"/%2e/login", 429},
				{"/%2E%2E/login", 429},
				{"/%6Cogin", 429},
				{"/login/", 429},
				{"/%2flogin", 400},
				{"/x%2F..%2Flogin", 400},
				{"/x\\..\\login", 400},
				{"/login%00", 400},
				{"/LOGIN", map[bool]int{false: 200, true: 429}[fold]},
			} {
				if got := rawRequest(t, e.Addr(), "POST", tt.target); got != tt.want {
					t.Errorf("request %d: POST %s = %d; want %d", i+1, tt.target, got, tt.want)
				}
			}
			if got := o.count("POST /login"); got != 2 {
				t.Errorf("the origin's /login handler was reached %d times; want 2 (the limit). Reached: %v", got, o.reached)
			}
			for _, p := range o.sent {
				if p != "/login" && p != "/LOGIN" {
					t.Errorf("the origin received %q; want the normal path", p)
				}
			}
			if m := scrape(t, e); !strings.Contains(m, `sluice_edge_requests_total{result="bad_path",route=""} 4`) {
				t.Errorf("metrics lack 4 bad_path requests")
			}
		})
	}
}
