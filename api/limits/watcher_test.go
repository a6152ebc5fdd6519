package limits

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testLogger routes a Watcher's logs to t.Log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// watchHarness is a Watcher on a temporary limits file, with its callbacks
// recorded.
type watchHarness struct {
	t       *testing.T
	path    string
	w       *Watcher
	reloads chan *Config
	errs    chan error
	nErrs   atomic.Int64
}

func newWatchHarness(t *testing.T, initial string, interval time.Duration) *watchHarness {
	t.Helper()
	h := &watchHarness{
		t:       t,
		path:    filepath.Join(t.TempDir(), "limits.yaml"),
		reloads: make(chan *Config, 100),
		errs:    make(chan error, 100),
	}
	writeFile(t, h.path, initial)
	w, err := NewWatcher(WatcherOptions{
		Path:     h.path,
		Interval: interval,
		Logger:   testLogger(t),
		OnReload: func(c *Config) { h.reloads <- c },
		OnError: func(err error) {
			h.nErrs.Add(1)
			h.errs <- err
		},
	})
	if err != nil {
		t.Fatalf("NewWatcher: %v", err)
	}
	h.w = w
	t.Cleanup(func() { w.Close() })
	return h
}

// limit returns the limit the watcher's current config gives key k of
// domain edge, or -1 for none.
func (h *watchHarness) limit() int64 {
	r, ok := h.w.Current().Lookup("edge", d("k=v"))
	if !ok {
		return -1
	}
	return r.Limit
}

func TestWatcherReload(t *testing.T) {
	h := newWatchHarness(t, rule("edge", "k", 10), 0)
	if got := h.limit(); got != 10 {
		t.Fatalf("initial limit = %d; want 10", got)
	}
	old := h.w.Current()

	writeFile(t, h.path, rule("edge", "k", 20))
	if err := h.w.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := h.limit(); got != 20 {
		t.Errorf("after the change, limit = %d; want 20", got)
	}
	if c := <-h.reloads; c != h.w.Current() {
		t.Errorf("OnReload got %p; want the current config %p", c, h.w.Current())
	}
	if r, _ := old.Lookup("edge", d("k=v")); r.Limit != 10 {
		t.Errorf("the old Config changed under its holder: limit %d; want 10", r.Limit)
	}
	if err := h.w.LastError(); err != nil {
		t.Errorf("LastError = %v; want nil", err)
	}
}

// A change that does not load is refused: the previous limits stay in
// force, and the error is returned, kept and reported, once.
func TestWatcherRefusesBrokenChange(t *testing.T) {
	h := newWatchHarness(t, rule("edge", "k", 10), 0)
	before := h.w.Current()

	writeFile(t, h.path, strings.Replace(rule("edge", "k", 10), "second", "fortnight", 1))
	err := h.w.Reload()
	var e *Error
	if !errors.As(err, &e) || e.Line != 5 || !strings.Contains(e.Reason, `unknown unit "fortnight"`) {
		t.Fatalf("Reload = %v; want the unknown unit on line 5", err)
	}
	if h.w.Current() != before || h.limit() != 10 {
		t.Errorf("after a broken change the config changed; want the previous one in force")
	}
	if got := h.w.LastError(); got != err {
		t.Errorf("LastError = %v; want %v", got, err)
	}
	if got := <-h.errs; got != err {
		t.Errorf("OnError got %v; want %v", got, err)
	}

	// The poll sees the broken files once, not at every tick.
	h.w.mu.Lock()
	h.w.reload(false)
	h.w.mu.Unlock()
	if n := h.nErrs.Load(); n != 1 {
		t.Errorf("OnError called %d times for one broken change; want 1", n)
	}

	// A file that disappears is refused the same way.
	writeFile(t, h.path, "")
	if err := h.w.Reload(); err == nil || h.limit() != 10 {
		t.Errorf("Reload of an empty file = %v, limit %d; want an error and 10", err, h.limit())
	}

	// Fixing the file clears the error.
	writeFile(t, h.path, rule("edge", "k", 30))
	if err := h.w.Reload(); err != nil {
		t.Fatalf("Reload after the fix: %v", err)
	}
	if h.limit() != 30 || h.w.LastError() != nil {
		t.Errorf("after the fix: limit %d, LastError %v; want 30, nil", h.limit(), h.w.LastError())
	}
}

// The polling goroutine notices a change by itself, including a
// Kubernetes ConfigMap update, which swaps a symlink.
func TestWatcherPolls(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, "1", map[string]string{"edge.yaml": rule("edge", "k", 10)})
	reloads := make(chan *Config, 10)
	w, err := NewWatcher(WatcherOptions{
		Path:     dir,
		Interval: time.Millisecond,
		Logger:   testLogger(t),
		OnReload: func(c *Config) { reloads <- c },
	})
	if err != nil {
		t.Fatalf("NewWatcher: %v", err)
	}
	defer w.Close()
	w.Start()
	w.Start() // a second Start does nothing

	configMap(t, dir, "2", map[string]string{"edge.yaml": rule("edge", "k", 20)})
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-reloads:
			if r, ok := c.Lookup("edge", d("k=v")); ok && r.Limit == 20 {
				if w.Current() != c {
					t.Errorf("Current is not the config OnReload got")
				}
				return
			}
		case <-deadline:
			t.Fatalf("the watcher did not pick up the swapped ConfigMap within 10s")
		}
	}
}

// Readers never see a torn or missing Config while reloads run.
func TestWatcherConcurrentReaders(t *testing.T) {
	h := newWatchHarness(t, rule("edge", "k", 1), time.Millisecond)
	h.w.Start()
	drained := make(chan struct{})
	go func() { // drain the callbacks
		defer close(drained)
		for range h.reloads {
		}
	}()
	defer func() {
		h.w.Close() // no more callbacks
		close(h.reloads)
		<-drained
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, ok := h.w.Current().Lookup("edge", d("k=v"))
				if !ok || (r.Limit != 1 && r.Limit != 2) {
					bad.Add(1)
				}
			}
		})
	}
	for i := range 50 {
		writeFile(t, h.path, rule("edge", "k", 1+i%2))
		if err := h.w.Reload(); err != nil {
			t.Errorf("Reload: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d lookups saw no rule or a wrong one during reloads", n)
	}
}

func TestNewWatcherErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "domain: d\ndescriptors:\n  - value: x\n")
	tests := []struct {
		o    WatcherOptions
		want string
	}{
		{WatcherOptions{}, "limits: WatcherOptions.Path is empty; set it to the limits file or directory"},
		{WatcherOptions{Path: bad, Interval: -time.Second}, "limits: WatcherOptions.Interval is negative; use 0 for the default of 2s"},
		{WatcherOptions{Path: bad}, "limits: " + bad + ":3: the descriptor has no key; add key: <descriptor key>, the key Envoy sends in its descriptor entry"},
		{WatcherOptions{Path: filepath.Join(dir, "nope")}, "limits: " + filepath.Join(dir, "nope") + ": cannot read the limits path: no such file or directory"},
	}
	for _, tc := range tests {
		w, err := NewWatcher(tc.o)
		if err == nil || err.Error() != tc.want {
			t.Errorf("NewWatcher(%+v) = %v, %v; want error %s", tc.o, w, err, tc.want)
		}
	}
}

func TestWatcherLifecycle(t *testing.T) {
	h := newWatchHarness(t, rule("edge", "k", 10), time.Millisecond)
	if h.w.interval != time.Millisecond {
		t.Errorf("interval = %v", h.w.interval)
	}
	// Close before Start, twice, then Start: nothing runs, nothing leaks.
	if err := h.w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := h.w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	h.w.Start()
	// Current and Reload still work after Close.
	writeFile(t, h.path, rule("edge", "k", 11))
	if err := h.w.Reload(); err != nil || h.limit() != 11 {
		t.Errorf("Reload after Close = %v, limit %d; want nil, 11", err, h.limit())
	}

	w, err := NewWatcher(WatcherOptions{Path: h.path})
	if err != nil {
		t.Fatal(err)
	}
	if w.interval != DefaultInterval {
		t.Errorf("default interval = %v; want %v", w.interval, DefaultInterval)
	}
	w.Start()
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
