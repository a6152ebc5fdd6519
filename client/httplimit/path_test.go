package httplimit_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client/httplimit"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestCleanPath: the normal form of paths, and the paths refused.
func TestCleanPath(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{"", "/", ""},
		{"/", "/", ""},
		{"/login", "/login", ""},
		{"//login", "/login", ""},
		{"///a//b///", "/a/b/", ""},
		{"/./login", "/login", ""},
		{"/x/../login", "/login", ""},
		{"/../../login", "/login", ""},
		{"/%2e/login", "/login", ""},
		{"/%2E%2e/login", "/login", ""},
		{"/a/b/..", "/a/", ""},
		{"/a/.", "/a/", ""},
		{"/..", "/", ""},
		{"/%6C%6Fgin", "/login", ""},
		{"/%7e%41", "/~A", ""},
		{"/LOGIN", "/LOGIN", ""},
		{"/a%20b", "/a%20b", ""},
		{"/a%3fb", "/a%3Fb", ""},
		{"/caf%c3%a9", "/caf%C3%A9", ""},
		{"/a%2Fb", "", "encoded"},
		{"/a%5cb", "", "encoded"},
		{"/a\\b", "", "backslash"},
		{"/a%00", "", "control"},
		{"/a\x01", "", "control"},
		{"/a%2", "", "malformed"},
		{"/a%zz", "", "malformed"},
		{"login", "", "slash"},
	} {
		got, err := httplimit.CleanPath(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("CleanPath(%q) = %q, %v; want an error about %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
		if again, err := httplimit.CleanPath(got); again != got || err != nil {
			t.Errorf("CleanPath(%q) = %q, %v; want it unchanged (idempotent)", got, again, err)
		}
	}
}

// FuzzCleanPath: CleanPath's form is a fixed point, with no empty or dot
// segment, and it never panics.
//
//	go test -fuzz FuzzCleanPath -fuzztime 15s ./client/httplimit
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/login", "//login", "/x/../login", "/%2e/login", "/a%2Fb", "/a/b/", "/%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := httplimit.CleanPath(in)
		if err != nil {
			return
		}
		if again, err := httplimit.CleanPath(got); again != got || err != nil {
			t.Fatalf("CleanPath(%q) = %q; CleanPath of that = %q, %v", in, got, again, err)
		}
		for _, seg := range strings.Split(strings.TrimSuffix(got[1:], "/"), "/") {
			if got != "/" && (seg == "" || seg == "." || seg == "..") {
				t.Fatalf("CleanPath(%q) = %q: segment %q", in, got, seg)
			}
		}
	})
}

// TestMiddlewareCleansPath: the middleware counts "//login", "/./login"
// and "/%2e/login" as "/login" (a Path() rule of 2 holds them all) and
// hands the handler the normal path; an ambiguous path is answered 400 and
// reaches neither Sluice nor the handler.
func TestMiddlewareCleansPath(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	l, err := httplimit.New(httplimit.Config{
		Client: newClient(t, n.Addr, nil),
		Rules:  []httplimit.Rule{{Name: "per_path", Key: httplimit.Path(), Limit: 2, Window: time.Hour}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(l.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.EscapedPath())
		mu.Unlock()
	})))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for i, tt := range []struct {
		target string
		want   int
	}{
		{"//login", 200},
		{"/./login", 200},
		{"/%2e/login", 429},
		{"/x/../login", 429},
		{"/a%2flogin", 400},
		{"/other", 200},
	} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", tt.target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("GET %s: %v", tt.target, err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("request %d: GET %s = %d; want %d", i+1, tt.target, resp.StatusCode, tt.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(seen, " "); got != "/login /login /other" {
		t.Errorf("the handler saw paths %q; want %q", got, "/login /login /other")
	}
}
