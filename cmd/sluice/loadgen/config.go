package loadgen

import (
	"fmt"
	"math"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// API is the gRPC API the calls go through.
type API string

const (
	// Native is sluice.v1.RateLimitService/Check: one call decides a batch
	// of checks.
	Native API = "native"
	// Envoy is envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit:
	// one call carries a descriptor per check, each with an inline limit.
	Envoy API = "envoy"
	// Client is Sluice's Go client (package client), shared by the
	// workers: it coalesces their checks into calls and, given several
	// addresses, sends each check to the node that decides its key. A call
	// of one check is Client.Check; of several, Client.CheckEach. It takes
	// the checks sluice.v1 takes (native).
	Client API = "client"
)

// Dist is how the workers pick the key of each check among Config.Keys
// keys numbered 0 to Keys-1.
type Dist string

const (
	// Uniform picks every key with the same probability.
	Uniform Dist = "uniform"
	// Zipf picks key k with a probability proportional to (1+k)^-s, s being
	// Config.ZipfS: key 0 is the hottest, then key 1, and so on.
	Zipf Dist = "zipf"
	// Hot always picks key 0: every check lands on one key, so on one actor
	// of one node.
	Hot Dist = "hot"
)

// EnvoyDomain is the domain of the Envoy calls. Each check is a descriptor
// with one entry, key=<KeyPrefix><n>, so Sluice counts it under the key
// "bench|key=<KeyPrefix><n>".
const EnvoyDomain = "bench"

// Config is what a run does. Fill it from DefaultConfig, change what you
// need and call Validate; Run does not change it.
type Config struct {
	// Addr is the address the connections given to Run talk to. Run does
	// not dial it; it is only reported. Default "127.0.0.1:8081".
	Addr string
	// API is the API the calls go through. Default Native.
	API API
	// Concurrency is the number of workers, each with at most one call in
	// flight. Default 64.
	Concurrency int
	// Connections is the number of gRPC connections the workers share
	// (worker i uses connection i mod Connections); at most Concurrency.
	// Run uses the connections it is given; this is what callers dial.
	// Default 8.
	Connections int
	// Duration is how long calls are recorded, after the warmup. Default
	// 10s.
	Duration time.Duration
	// Warmup is how long calls are sent, before Duration, without being
	// recorded: connections warm up, keys load, the server's caches fill.
	// Default 1s; 0 records from the first call.
	Warmup time.Duration
	// Rate is the target of the open loop, in calls per second over all
	// workers; 0 (the default) runs a closed loop.
	Rate float64
	// Keys is the number of distinct keys, for Uniform and Zipf. Default
	// 10000.
	Keys int
	// Dist is how keys are picked. Default Uniform.
	Dist Dist
	// ZipfS is the exponent s of Zipf, above 1; the higher, the more the
	// hottest keys take. Default 1.1.
	ZipfS float64
	// KeyPrefix starts every key; key n is KeyPrefix followed by n in
	// decimal. Default "bench:".
	KeyPrefix string
	// Batch is the number of checks per call. Default 1.
	Batch int
	// Limit is the limit of every check, in hits per Window. The default,
	// 1e9, lets every check through, to measure the decision path; a low
	// limit exercises denials. At most 2^32-1 for Envoy.
	Limit int64
	// Window is the window of every check. Default 1m. For Envoy, a whole
	// number of seconds (sent as a unit and a multiplier).
	Window time.Duration
	// Algorithm is the algorithm of every check; unspecified (the default)
	// lets the server choose (sliding log unless an override says
	// otherwise). Native only: Envoy's API has no such field.
	Algorithm sluicepb.Algorithm
	// Timeout is the deadline of each call. Default 5s.
	Timeout time.Duration
	// Seed seeds the key pickers (worker i uses Seed and i), so that two
	// runs pick the same keys in the same order per worker. Default 1.
	Seed uint64
	// Progress, if not nil, is called every ProgressInterval from a
	// goroutine of Run, never concurrently with itself.
	Progress func(Progress)
	// ProgressInterval is how often Progress is called. Default 1s.
	ProgressInterval time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Addr:             "127.0.0.1:8081",
		API:              Native,
		Concurrency:      64,
		Connections:      8,
		Duration:         10 * time.Second,
		Warmup:           time.Second,
		Keys:             10000,
		Dist:             Uniform,
		ZipfS:            1.1,
		KeyPrefix:        "bench:",
		Batch:            1,
		Limit:            1_000_000_000,
		Window:           time.Minute,
		Timeout:          5 * time.Second,
		Seed:             1,
		ProgressInterval: time.Second,
	}
}

// ConfigError is what Validate returns: a field of Config and why its value
// cannot be used.
type ConfigError struct {
	// Field is the name of the Config field, e.g. "Concurrency".
	Field string
	// Value is the field's value.
	Value any
	// Reason says what is wrong and what would do.
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("loadgen: %s %v: %s", e.Field, e.Value, e.Reason)
}

// Validate reports the first field of c that cannot be used, as a
// *ConfigError.
func (c *Config) Validate() error {
	bad := func(field string, value any, format string, args ...any) error {
		return &ConfigError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.API != Native && c.API != Envoy && c.API != Client:
		return bad("API", c.API, "want %s, %s or %s", Native, Envoy, Client)
	case c.Concurrency < 1:
		return bad("Concurrency", c.Concurrency, "want at least 1 worker")
	case c.Connections < 1:
		return bad("Connections", c.Connections, "want at least 1 connection")
	case c.Connections > c.Concurrency:
		return bad("Connections", c.Connections, "more connections than the %d workers that would use them", c.Concurrency)
	case c.Duration <= 0:
		return bad("Duration", c.Duration, "want a positive duration")
	case c.Warmup < 0:
		return bad("Warmup", c.Warmup, "want 0 or a positive duration")
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return bad("Rate", c.Rate, "want calls per second, or 0 for a closed loop")
	case c.Rate > 1e9:
		return bad("Rate", c.Rate, "above one call per nanosecond")
	case c.Rate > 0 && c.Rate < 1/c.Duration.Seconds():
		return bad("Rate", c.Rate, "less than one call in %v: raise it, or the duration", c.Duration)
	case c.Dist != Uniform && c.Dist != Zipf && c.Dist != Hot:
		return bad("Dist", c.Dist, "want %s, %s or %s", Uniform, Zipf, Hot)
	case c.Keys < 1:
		return bad("Keys", c.Keys, "want at least 1 key")
	case c.Dist == Zipf && (!(c.ZipfS > 1) || math.IsInf(c.ZipfS, 0)):
		return bad("ZipfS", c.ZipfS, "want an exponent above 1 (1.1 is mildly skewed, 2 very)")
	case c.Batch < 1:
		return bad("Batch", c.Batch, "want at least 1 check per call")
	case c.Limit < 1:
		return bad("Limit", c.Limit, "want at least 1 hit per window")
	case c.API == Envoy && c.Limit > math.MaxUint32:
		return bad("Limit", c.Limit, "above %d, the largest limit Envoy's API carries", uint32(math.MaxUint32))
	case c.Window <= 0:
		return bad("Window", c.Window, "want a positive duration")
	case c.API == Envoy && c.Window%time.Second != 0:
		return bad("Window", c.Window, "Envoy's API counts windows in whole seconds")
	case c.API == Envoy && c.Window/time.Second > math.MaxUint32:
		return bad("Window", c.Window, "too long for Envoy's API")
	case sluicepb.Algorithm_name[int32(c.Algorithm)] == "":
		return bad("Algorithm", c.Algorithm, "unknown algorithm")
	case c.API == Envoy && c.Algorithm != sluicepb.Algorithm_ALGORITHM_UNSPECIFIED:
		return bad("Algorithm", c.Algorithm, "Envoy's API has no algorithm field: use the native API, or an override")
	case c.Timeout <= 0:
		return bad("Timeout", c.Timeout, "want a positive deadline per call")
	case c.Progress != nil && c.ProgressInterval <= 0:
		return bad("ProgressInterval", c.ProgressInterval, "want a positive interval")
	}
	return nil
}

// open reports whether c runs an open loop.
func (c *Config) open() bool { return c.Rate > 0 }
