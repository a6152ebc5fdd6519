package edge

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
)

// FuzzParseRules: a rules file either parses into rules that build, or is
// refused with an error; it never panics.
//
//	go test -fuzz FuzzParseRules -fuzztime 15s ./cmd/sluice/edge
func FuzzParseRules(f *testing.F) {
	f.Add([]byte(rulesYAML))
	f.Add([]byte("routes:\n  - name: a\n    rules:\n      - {name: r, key: ip+header:X, limit: 1, window: 7d}\n"))
	f.Add([]byte("routes: [{name: a, methods: [GET, POST], on_error: closed}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rf, err := ParseRules(data)
		if err != nil {
			return
		}
		c, cerr := clientForFuzz()
		if cerr != nil {
			t.Fatal(cerr)
		}
		defer c.Close()
		m := newMetrics(newRegistry(), c)
		if _, err := build(rf, baseForFuzz(c), m); err != nil {
			t.Fatalf("ParseRules accepted %q, but build refused it: %v", data, err)
		}
	})
}

func clientForFuzz() (*client.Client, error) {
	cfg := client.DefaultConfig()
	cfg.Addr = "127.0.0.1:1"
	return client.New(cfg)
}

func baseForFuzz(c *client.Client) httplimit.Config { return httplimit.Config{Client: c} }

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
