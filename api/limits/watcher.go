package limits

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher reads its files when
// WatcherOptions.Interval is 0.
const DefaultInterval = 2 * time.Second

// WatcherOptions configures a Watcher. It is not modified or kept after
// NewWatcher returns, except for the functions and the logger.
type WatcherOptions struct {
	// Path is a limits file, or a directory of them, as Load takes.
	// Required, unless XDS is set.
	Path string
	// XDS, when set, takes the limits from an xDS management server
	// instead of Path (see XDSOptions); Interval is then unused.
	XDS *XDSOptions
	// MergeDomains lets a domain span several files (see LoadOptions).
	MergeDomains bool
	// Interval is how often the polling goroutine reads the files to see
	// whether they changed. Default DefaultInterval (2s); it must not be
	// negative. Polling (rather than inotify) sees a Kubernetes ConfigMap
	// update, which swaps a symlink that file watchers often miss.
	Interval time.Duration
	// Logger receives a line for each reload and each refused change. nil
	// discards them.
	Logger *slog.Logger
	// OnReload, if set, is called with each Config the Watcher puts in
	// force after the first (which NewWatcher loads). It runs on the
	// goroutine that reloaded (the polling goroutine, or Reload's caller)
	// while reloads are serialized: it may call Current and LastError but
	// not Reload or Close, and it delays the next reload while it runs.
	OnReload func(*Config)
	// OnError, if set, is called with the error of each change that was
	// refused, under the same rules as OnReload. A change is reported once,
	// not at every poll.
	OnError func(error)
}

// Watcher keeps the Config of a limits path current: it reloads the files
// when they change and swaps the new Config in atomically, so no request
// ever sees a half-loaded Config or waits for a reload. A change that does
// not load (a syntax error, a bad unit, a file that cannot be read) is
// refused: the previous Config stays in force and the error is logged,
// kept for LastError and passed to OnError.
//
// Current is safe to call from any goroutine and takes no lock. The
// polling goroutine is the Watcher's only periodic work; it reads and
// hashes the files, and never touches rate limit keys.
type Watcher struct {
	path     string
	load     LoadOptions
	interval time.Duration
	log      *slog.Logger
	onReload func(*Config)
	onError  func(error)

	cur    atomic.Pointer[Config]
	loaded atomic.Bool // a Config from Path or from xDS is in force

	mu         sync.Mutex // serializes reloads; guards seen and xdsVersion
	seen       [sha256.Size]byte
	xds        *XDSOptions           // nil: the limits come from path
	xdsVersion string                // the version of the xDS response in force
	lastErr    atomic.Pointer[error] // nil after a successful load

	life    sync.Mutex // guards started and closed
	started bool
	closed  bool
	stop    chan struct{}
	cancel  context.CancelFunc // ends the xDS stream
	wg      sync.WaitGroup
}

// NewWatcher loads o.Path once, synchronously, and returns a Watcher
// serving that Config, or the error of that first load. Call Start to
// begin polling and Close when done.
//
// With o.XDS, NewWatcher loads nothing: the Watcher serves an empty Config
// until Start has received the first set of limits from the management
// server (see Loaded).
func NewWatcher(o WatcherOptions) (*Watcher, error) {
	if o.XDS != nil {
		return newXDSWatcher(o)
	}
	if o.Path == "" {
		return nil, &Error{Reason: "WatcherOptions.Path is empty; set it to the limits file or directory"}
	}
	if o.Interval < 0 {
		return nil, &Error{Reason: "WatcherOptions.Interval is negative; use 0 for the default of 2s"}
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		path:     o.Path,
		load:     LoadOptions{MergeDomains: o.MergeDomains},
		interval: o.Interval,
		log:      log.With("component", "limits", "path", o.Path),
		onReload: o.OnReload,
		onError:  o.OnError,
		stop:     make(chan struct{}),
	}
	w.loaded.Store(true)
	srcs, err := readSources(o.Path)
	if err != nil {
		return nil, err
	}
	cfg, err := build(srcs, w.load)
	if err != nil {
		return nil, err
	}
	w.seen = fingerprint(srcs)
	w.cur.Store(cfg)
	w.log.Info("limits loaded", "version", cfg.Version(), "domains", len(cfg.names))
	return w, nil
}

// Start starts the polling goroutine. Calling it again, or after Close,
// does nothing.
func (w *Watcher) Start() {
	w.life.Lock()
	defer w.life.Unlock()
	if w.started || w.closed {
		return
	}
	w.started = true
	w.wg.Add(1)
	if w.xds != nil {
		ctx, cancel := context.WithCancel(context.Background())
		w.cancel = cancel
		go w.runXDS(ctx)
		return
	}
	go w.poll()
}

// newXDSWatcher is NewWatcher for o.XDS.
func newXDSWatcher(o WatcherOptions) (*Watcher, error) {
	x := *o.XDS
	switch {
	case o.Path != "":
		return nil, &Error{Reason: "WatcherOptions has both a Path and XDS; the limits come from one of them"}
	case x.Server == "":
		return nil, &Error{Reason: "XDSOptions.Server is empty; set it to the management server's host:port"}
	case x.MinBackoff < 0 || x.MaxBackoff < 0:
		return nil, &Error{Reason: "XDSOptions: backoffs must not be negative"}
	}
	if x.NodeID == "" {
		x.NodeID = "default"
	}
	if x.MinBackoff == 0 {
		x.MinBackoff = time.Second
	}
	if x.MaxBackoff == 0 {
		x.MaxBackoff = 30 * time.Second
	}
	x.MaxBackoff = max(x.MaxBackoff, x.MinBackoff)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		load:     LoadOptions{MergeDomains: o.MergeDomains},
		log:      log.With("component", "limits", "xds_server", x.Server),
		onReload: o.OnReload,
		onError:  o.OnError,
		stop:     make(chan struct{}),
		xds:      &x,
	}
	w.cur.Store(&Config{domains: map[string]*domain{}})
	return w, nil
}

// Loaded reports whether limits are in force: always for a Watcher of
// files; for one of xDS, once the first response was put in force.
func (w *Watcher) Loaded() bool { return w.loaded.Load() }

// Current returns the Config in force. It never returns nil and takes no
// lock: call it for every request rather than keeping the result.
func (w *Watcher) Current() *Config { return w.cur.Load() }

// Reload reads the files now, whether or not they changed (for SIGHUP, and
// tests), and puts them in force. On error the previous Config stays in
// force and the error is returned, kept for LastError and passed to
// OnError.
//
// A Watcher of xDS returns ErrXDS: its server pushes every change.
func (w *Watcher) Reload() error {
	if w.xds != nil {
		return ErrXDS
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reload(true)
}

// LastError returns the error of the latest change that was refused, or nil
// if the latest load succeeded.
func (w *Watcher) LastError() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops the polling goroutine and waits for it to return. It is
// idempotent and always returns nil. Current keeps working after Close.
func (w *Watcher) Close() error {
	w.life.Lock()
	if w.closed {
		w.life.Unlock()
		return nil
	}
	w.closed = true
	close(w.stop)
	if w.cancel != nil {
		w.cancel()
	}
	w.life.Unlock()
	w.wg.Wait()
	return nil
}

func (w *Watcher) poll() {
	defer w.wg.Done()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			w.reload(false)
			w.mu.Unlock()
		}
	}
}

// reload reads the files and, if forced or they differ from what was last
// read, loads them. w.mu must be held.
func (w *Watcher) reload(force bool) error {
	srcs, err := readSources(w.path)
	var sum [sha256.Size]byte
	if err != nil {
		sum = sha256.Sum256([]byte(err.Error())) // report the same failure once
	} else {
		sum = fingerprint(srcs)
	}
	if !force && sum == w.seen {
		return nil
	}
	w.seen = sum
	var cfg *Config
	if err == nil {
		cfg, err = build(srcs, w.load)
	}
	if err != nil {
		w.refuse(err)
		return err
	}
	w.put(cfg)
	return nil
}

// put puts cfg in force and reports it. w.mu must be held.
func (w *Watcher) put(cfg *Config, attrs ...any) {
	prev := w.cur.Swap(cfg)
	w.loaded.Store(true)
	w.lastErr.Store(nil)
	w.log.Info("limits reloaded", append([]any{"version", cfg.Version(), "previous", prev.Version(), "domains", len(cfg.names)}, attrs...)...)
	if w.onReload != nil {
		w.onReload(cfg)
	}
}

// refuse reports a change that did not load. w.mu must be held.
func (w *Watcher) refuse(err error, attrs ...any) {
	w.lastErr.Store(&err)
	w.log.Error("limits change refused; the previous limits stay in force",
		append([]any{"version", w.cur.Load().Version(), "err", err}, attrs...)...)
	if w.onError != nil {
		w.onError(err)
	}
}
