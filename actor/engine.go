package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/shard"
)

// DefaultMaxKeys is Config.MaxKeys when it is not set and the engine has a
// Store: keys past it leave memory, and their state stays on disk (at about
// 250 bytes a key in memory, 32 MiB of keys). A large key space then costs
// the node no more memory than this many keys do; at a million keys in use
// it also costs less CPU per decision than holding them all, whose entries
// the garbage collector marks again and again (docs/benchmarks.md, "How
// cost grows with the key space").
const DefaultMaxKeys = 131_072

// DefaultMemoryMaxKeys is Config.MaxKeys when it is not set and the engine
// has no Store (memory mode), where keys cannot leave memory and a new key
// past the bound is refused.
const DefaultMemoryMaxKeys = 1_000_000

// Errors returned by the engine. Callers may match them with errors.Is.
var (
	// ErrOverloaded means an actor's mailbox was full: the node is saturated.
	// Nothing was recorded for the call unless the call spanned several
	// actors and another one had already taken its part (see docs/engine.md).
	ErrOverloaded = errors.New("actor: overloaded: mailbox full; retry with backoff or add capacity")
	// ErrClosed means the engine is shutting down.
	ErrClosed = errors.New("actor: engine closed")
	// ErrTooManyKeys means the node holds Config.MaxKeys keys in memory and,
	// with no data file to evict them to, cannot take a new one.
	ErrTooManyKeys = errors.New("actor: too many keys in memory; raise max keys or run with a data file")
	// ErrBatchTooLarge means a call carried more than Limits.MaxBatch checks.
	ErrBatchTooLarge = errors.New("actor: too many checks in one call")
	// ErrStale means a fenced call (CallOptions.Generation) met a key that
	// this engine no longer owns (Config.Owner) after the ownership
	// generation moved on (Engine.Fence). Returned as is, it means that
	// nothing of the call was recorded: the caller may route it again.
	ErrStale = errors.New("actor: ownership of a key moved during the call; route it again")
	// ErrStalePartial means that a fenced call was refused as stale by some
	// of the actors holding its keys and decided and recorded by the
	// others: the caller must not retry the whole call. A *StaleError
	// matches it and ErrStale, and says which checks were refused.
	ErrStalePartial = errors.New("actor: ownership of a key moved during the call after part of it was decided and recorded; route only the refused checks again")
	// ErrReplication means that the Replicator did not confirm the write
	// holding the call's hits (the error wraps the Replicator's too). The
	// hits are recorded and committed here, and count in every later
	// decision of this node, but were not acknowledged: the caller may
	// treat the call as failed (conservative: the hits stay counted).
	ErrReplication = errors.New("actor: the standby did not confirm the write; its hits are recorded here but not acknowledged")
	// ErrNoStore means a call needs a data file and the engine runs in
	// memory mode (Config.Store nil): PutReplicas and PutFollower write
	// to the store, and a key Evict dropped from memory would be lost.
	ErrNoStore = errors.New("actor: the call needs a data file; this engine runs in memory mode")
	// ErrDamaged means that a key's stored state cannot be decoded: the
	// data file holds a damaged record. A *DamagedError matches it and
	// names the key. It costs that key only: in a call, the key's check is
	// not decided (Decision.Err) and the others are. Resetting the key
	// clears it.
	ErrDamaged = errors.New("actor: stored state damaged")
)

// DamagedError is a key whose stored state cannot be decoded (ErrDamaged).
type DamagedError struct {
	Key string
	Err error // why it cannot be decoded
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("actor: key %s: its stored state is damaged and cannot be decoded (%v); its hits are lost: reset the key to use it again (sluice key reset), and check the data file offline (sluice data verify)", QuoteKey(e.Key), e.Err)
}

// Is makes a *DamagedError match ErrDamaged.
func (e *DamagedError) Is(target error) bool { return target == ErrDamaged }

// errPartlySent is ErrOverloaded after some actors already took their part.
var errPartlySent = fmt.Errorf("%w (after part of the call was sent)", ErrOverloaded)

// Config configures an Engine. The zero value of a field means its default.
type Config struct {
	// Actors is the number of actor goroutines keys are spread over.
	// Default 4 × GOMAXPROCS.
	Actors int
	// MailboxSize is how many calls may wait for one actor before Check
	// returns ErrOverloaded. Default 1024.
	MailboxSize int
	// MaxDrain is the most calls an actor takes from its mailbox to decide as
	// one batch (one storage write). Default 512.
	MaxDrain int
	// MaxKeys bounds the keys held in memory by the whole node. Past it the
	// least recently used keys leave memory (their state stays on disk). In
	// memory mode (no Store) a new key past the bound gets ErrTooManyKeys.
	// Default DefaultMaxKeys with a Store, DefaultMemoryMaxKeys without.
	MaxKeys int
	// MaxLogRuns bounds a sliding log: with a limit above it, hit times are
	// rounded up to window/MaxLogRuns, so a log never holds more than
	// MaxLogRuns+1 runs. At or below it the log is exact. Default 1000.
	MaxLogRuns int
	// Limits bounds what a check may ask for.
	Limits Limits
	// Store persists key state. Nil runs in memory only: a restart forgets
	// every key. The engine does not close it.
	Store *persist.Store
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// Observer receives the engine's measurements; nil discards them.
	Observer Observer
	// Owner says which keys this node owns now (in a cluster, its
	// router). The actors ask it only about a fenced call
	// (CallOptions.Generation) whose generation is not the engine's
	// current one (see Engine.Fence), once per key of the actor's part of
	// the call. Nil means every key is owned: no call is ever refused as
	// stale.
	Owner Owner
	// Replicator, if not nil, receives the records of every storage write
	// of the actors once the store committed it, and in the commit and
	// fsync modes a call whose hits were in a write is acknowledged only
	// once the Replicator confirmed it too (see Replicator). Nil: none. It
	// is not used in memory mode (no Store: there are no writes).
	Replicator Replicator
	// Trace adds an event to the span of each call's context (the
	// OpenTelemetry span a traced gRPC call carries) when the call is
	// decided ("decided"), when its hits are committed ("committed") and
	// when its standby confirmed them ("copied to standby"). False: the
	// contexts are not read.
	Trace bool
}

// Owner says which keys this node owns now: the cluster's ownership, as
// the engine's fencing asks it (see Config.Owner).
type Owner interface {
	// Decidable reports whether this node may decide key now. It must be
	// safe for concurrent use, quick, and must not call the engine.
	Decidable(key string) bool
}

// OwnerFunc is a function as an Owner.
type OwnerFunc func(key string) bool

// Decidable implements Owner.
func (f OwnerFunc) Decidable(key string) bool { return f(key) }

// Replicator keeps copies of what the engine writes elsewhere (the
// cluster's standbys).
type Replicator interface {
	// Replicate is called with the records of one storage write of an
	// actor (the same records, in the same order, that it submitted to the
	// store) once the store committed them, on the store's writer
	// goroutine (its done callback), in commit order. A write that failed
	// is not replicated: its hits are not recorded anywhere. Replicate
	// must not block, nor call the engine or the store. It calls done
	// exactly once, from any goroutine: nil when the records are safe
	// wherever it keeps copies, or the reason they are not.
	//
	// recs and their values belong to the engine: they may be read until
	// done is called, never modified or kept after.
	//
	// In the commit and fsync modes, a call whose hits were in the write
	// is acknowledged once done arrived; if done reports an error, the
	// call fails with ErrReplication (its hits stay recorded here: they
	// were committed). Calls that recorded nothing are acknowledged at
	// once, and in async mode every call is, before the commit.
	Replicate(recs []persist.Record, done func(error))
}

// Observer receives measurements from the engine for metrics. Its methods
// are called from actor goroutines and must not block.
type Observer interface {
	// Batch is called after an actor decided a batch: how many checks it
	// decided and how many calls were still waiting in its mailbox.
	Batch(actor, checks, queued int)
	// Keys is called when an actor's count of keys in memory changes by delta.
	Keys(delta int)
	// Evicted is called when n keys left memory for the memory bound.
	Evicted(n int)
	// Expired is called when n empty keys left memory on their alarm.
	Expired(n int)
	// Damaged is called once per key whose stored state an actor found
	// damaged (see ErrDamaged), the first time it is read.
	Damaged()
}

type nopObserver struct{}

func (nopObserver) Batch(int, int, int) {}
func (nopObserver) Keys(int)            {}
func (nopObserver) Evicted(int)         {}
func (nopObserver) Expired(int)         {}
func (nopObserver) Damaged()            {}

func (c Config) withDefaults() Config {
	if c.Actors <= 0 {
		c.Actors = 4 * runtime.GOMAXPROCS(0)
	}
	if c.MailboxSize <= 0 {
		c.MailboxSize = 1024
	}
	if c.MaxDrain <= 0 {
		c.MaxDrain = 512
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = DefaultMaxKeys
		if c.Store == nil {
			c.MaxKeys = DefaultMemoryMaxKeys
		}
	}
	if c.MaxLogRuns <= 0 {
		c.MaxLogRuns = 1000
	}
	c.Limits = c.Limits.withDefaults()
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return c
}

// Effective returns c with the fields left at zero set to their
// defaults: the values an Engine built from c works with (for a start-up
// log, say).
func (c Config) Effective() Config { return c.withDefaults() }

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Actors > 1<<16:
		return fmt.Errorf("actor: config: %d actors; at most 65536", c.Actors)
	case c.MaxKeys < c.Actors:
		return fmt.Errorf("actor: config: max keys %d is below the number of actors %d", c.MaxKeys, c.Actors)
	case c.MaxKeys/c.Actors > 1<<30:
		return fmt.Errorf("actor: config: max keys %d is above 2^30 per actor (%d actors)", c.MaxKeys, c.Actors)
	case c.Limits.MinWindow > c.Limits.MaxWindow:
		return fmt.Errorf("actor: config: min window %v above max window %v", c.Limits.MinWindow, c.Limits.MaxWindow)
	}
	return nil
}

// Engine decides checks. Each key belongs to one actor goroutine, picked by
// shard.Index; that goroutine is the only code that reads or writes the key's
// state. Engine methods are safe for concurrent use.
type Engine struct {
	cfg    Config
	actors []*actor
	store  *persist.Store

	// gen is the ownership generation (Fence, Generation); never 0, which
	// marks an unfenced call.
	gen atomic.Uint64
	// reserving counts the fenced reserving calls in flight, for Collect.
	reserving reservations

	closing   atomic.Bool
	quit      chan struct{} // closed by Close: actors drain and exit
	exited    chan struct{} // closed once every actor has exited
	wg        sync.WaitGroup
	closeOnce sync.Once

	calls sync.Pool
}

// New starts an engine: its actors and, with a store, the janitor that
// deletes expired keys from disk.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:    cfg,
		store:  cfg.Store,
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	e.gen.Store(1)
	e.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	perActor := cfg.MaxKeys / cfg.Actors
	for i := 0; i < cfg.Actors; i++ {
		e.actors = append(e.actors, newActor(e, i, perActor))
	}
	var actorsWG sync.WaitGroup
	for _, a := range e.actors {
		actorsWG.Add(1)
		go func() {
			defer actorsWG.Done()
			a.loop()
		}()
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		actorsWG.Wait()
		close(e.exited)
	}()
	if e.store != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.janitor()
		}()
	}
	return e, nil
}

// Check decides checks as one call and writes one decision per check into
// out, which must be as long as checks. Checks on keys of different actors
// are decided in parallel; each actor decides its share in one batch.
//
// An invalid check fails the whole call with an *InvalidCheckError before
// anything is recorded. In the durable storage modes Check returns only once
// the hits it recorded are committed. Check is Do without options.
func (e *Engine) Check(ctx context.Context, checks []Check, out []Decision) error {
	return e.do(ctx, checks, out, CallOptions{}) // Do, minus a call
}

// CallOptions are the options of a call to Do. The zero value is a plain
// Check.
type CallOptions struct {
	// Generation fences the call: the engine's ownership generation
	// (Engine.Generation) that the caller read before it looked up the
	// keys' owner and routed the call here. An actor that finds the engine
	// at another generation asks Config.Owner about each key of its part and
	// refuses the part, recording nothing, if one is not owned (ErrStale).
	// 0: not fenced.
	Generation uint64
	// Marks, when not nil, must be as long as the checks; it receives for
	// each recorded check where its hits went, so that Release can take
	// them back (as CheckMarked).
	Marks []int64
	// AllOrNothing records the hits of the call only if every check is
	// allowed (as CheckAll).
	AllOrNothing bool
}

// Do decides checks as one call, as Check, with the options in opt.
//
// A fenced call (opt.Generation not 0) may be refused as stale, part by
// part (one part per actor holding some of its keys). If every part was
// refused, nothing was recorded and Do returns ErrStale. If some parts
// were decided and others refused, Do returns a *StaleError (matching
// ErrStalePartial and ErrStale) that lists the refused checks; the
// decisions of the others are in out and were recorded, and out holds the
// zero Decision for a refused check. A reserving call (opt.Marks or
// opt.AllOrNothing) first releases what its decided parts reserved, and
// returns ErrStale if nothing of the call stays recorded then, or the
// *StaleError if a refund or a penalty in a decided part was applied (it
// cannot be taken back). See Engine.Fence for the ordering guarantee.
func (e *Engine) Do(ctx context.Context, checks []Check, out []Decision, opt CallOptions) error {
	if opt.Generation != 0 && (opt.Marks != nil || opt.AllOrNothing) {
		return e.doReserving(ctx, checks, out, opt)
	}
	return e.do(ctx, checks, out, opt)
}

// do is Do; a fenced reserving call goes through doReserving first.
func (e *Engine) do(ctx context.Context, checks []Check, out []Decision, opt CallOptions) error {
	if err := e.validate(checks, out); err != nil || len(checks) == 0 {
		return err
	}
	marks := opt.Marks
	if marks != nil && len(marks) != len(checks) {
		return fmt.Errorf("actor: %d checks but %d marks", len(checks), len(marks))
	}
	// In memory mode an actor at its key bound refuses its part of a call
	// (ErrTooManyKeys) while others may decide theirs: marks let the engine
	// take those back, so that a refused call records nothing.
	reserving := marks != nil || opt.AllOrNothing
	if (reserving || e.store == nil && len(checks) > 1) && marks == nil {
		marks = make([]int64, len(checks))
	}
	c := e.calls.Get().(*call)
	c.ctx, c.checks, c.out, c.marks, c.gen = ctx, checks, out, marks, opt.Generation
	if err := e.run(c); err != nil {
		var se *StaleError
		switch {
		case reserving && errors.As(err, &se):
			return e.unreserve(ctx, checks, out, marks, se)
		case marks != nil && errors.Is(err, ErrTooManyKeys):
			return e.unreserveFull(ctx, checks, out, marks)
		}
		return err
	}
	if !opt.AllOrNothing {
		return nil
	}
	denied := false
	for i := range out {
		denied = denied || !out[i].Allowed
	}
	if !denied {
		return nil
	}
	release, releaseMarks := Unwind(checks, out, marks)
	return e.Release(ctx, release, releaseMarks)
}

// validate checks a call before anything is sent.
func (e *Engine) validate(checks []Check, out []Decision) error {
	if len(out) != len(checks) {
		return fmt.Errorf("actor: %d checks but room for %d decisions", len(checks), len(out))
	}
	if len(checks) > e.cfg.Limits.MaxBatch {
		return fmt.Errorf("%w: %d checks; the maximum is %d", ErrBatchTooLarge, len(checks), e.cfg.Limits.MaxBatch)
	}
	for i := range checks {
		if err := checks[i].validate(i, e.cfg.Limits); err != nil {
			return err
		}
	}
	if e.closing.Load() {
		return ErrClosed
	}
	return nil
}

// run dispatches c from the pool, waits for it and recycles it when that
// is safe.
func (e *Engine) run(c *call) error {
	err, done := e.wait(c)
	if done {
		c.reset()
		e.calls.Put(c)
	}
	return err
}

// wait dispatches c and waits for its actors. done reports that no actor
// holds c any more, so that it may be reused.
func (e *Engine) wait(c *call) (err error, done bool) {
	err = e.dispatch(c)
	switch {
	case err == errPartlySent:
		return ErrOverloaded, false
	case err != nil:
		return err, true
	}
	select {
	case <-c.done:
		return c.outcome(), true
	case <-c.ctx.Done():
		c.aborted.Store(true)
		return fmt.Errorf("actor: %w", c.ctx.Err()), false
	case <-e.exited:
		select {
		case <-c.done:
			return c.outcome(), true
		default:
			return ErrClosed, false
		}
	}
}

// dispatch sends c to the actors that own its keys (to all of them for a
// broadcast).
func (e *Engine) dispatch(c *call) error {
	n := len(e.actors)
	if c.broadcast() {
		c.parts = int32(n)
		c.pending.Store(int32(n))
		for i, a := range e.actors {
			select {
			case a.mailbox <- c:
			default:
				c.aborted.Store(true)
				c.pending.Add(-int32(n - i))
				if i == 0 {
					return ErrOverloaded
				}
				return errPartlySent
			}
		}
		return nil
	}
	if cap(c.shards) < len(c.checks) {
		c.shards = make([]uint16, len(c.checks))
	}
	c.shards = c.shards[:len(c.checks)]
	first := shard.Index(c.checks[0].Key, n)
	c.shards[0] = uint16(first)
	single := true
	for i := 1; i < len(c.checks); i++ {
		s := shard.Index(c.checks[i].Key, n)
		c.shards[i] = uint16(s)
		single = single && s == first
	}
	if single {
		c.parts = 1
		c.pending.Store(1)
		select {
		case e.actors[first].mailbox <- c:
			return nil
		default:
			c.pending.Store(0)
			return ErrOverloaded
		}
	}
	// Several actors: count them first, so that no actor can finish the call
	// before every part is sent.
	if cap(c.targets) < n {
		c.targets = make([]bool, n)
	}
	c.targets = c.targets[:n]
	clear(c.targets)
	count := int32(0)
	for _, s := range c.shards {
		if !c.targets[s] {
			c.targets[s] = true
			count++
		}
	}
	c.parts = count
	if c.gen != 0 {
		// Where a refusal as stale is noted, per actor (see call.outcome).
		if cap(c.staleParts) < n {
			c.staleParts = make([]bool, n)
		}
		c.staleParts = c.staleParts[:n]
		clear(c.staleParts)
	}
	c.pending.Store(count)
	for s, want := range c.targets {
		if !want {
			continue
		}
		select {
		case e.actors[s].mailbox <- c:
			count--
		default:
			// The parts already sent may be decided before they see the
			// abort; the call is never reused (see Check).
			c.aborted.Store(true)
			c.pending.Add(-count)
			return errPartlySent
		}
	}
	return nil
}

// Close stops the engine: new calls get ErrClosed, the actors decide what is
// already in their mailboxes and exit, and the store is flushed. It does not
// close the store. Close is idempotent.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		close(e.quit)
		e.wg.Wait()
		if e.store != nil {
			err = e.store.Flush()
		}
	})
	return err
}

// janitor deletes expired keys from disk: one timer, armed for the earliest
// deadline in the store's deadline index, so it sleeps while no key is due.
func (e *Engine) janitor() {
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var fire <-chan time.Time
		if next := e.store.NextDeadline(); next != 0 {
			if timer == nil {
				timer = e.cfg.Clock.NewTimer(time.Hour)
			}
			timer.ResetAt(time.Unix(0, next))
			fire = timer.C()
		}
		select {
		case <-e.quit:
			return
		case <-e.store.DeadlineChanged():
		case <-fire:
			sweep := e.store.Sweep(e.cfg.Clock.Now().UnixNano())
			select {
			case <-sweep.Done():
				if err := sweep.Err(); err != nil {
					e.cfg.Logger.Error("sweep expired keys", "err", err)
				}
			case <-e.quit:
				return
			}
		}
	}
}

// opKind is what a call asks of its actors.
type opKind uint8

const (
	opCheck   opKind = iota // decide the checks
	opRelease               // take back the hits a reserving opCheck recorded
	opInspect               // fill view with the state of checks[0].Key
	opReset                 // forget checks[0].Key
	opList                  // list keys by prefix into lists[actor]
	opImport                // merge states[i] into checks[i].Key
	opCollect               // read moved keys (all actors with moved, or checks' keys)
	opForget                // delete checks[i].Key if it still holds states[i]
	opEvict                 // drop from memory the keys for which moved is true (all actors)
)

// call is one Check in flight. Each actor that owns some of its keys decides
// them, writes their decisions into out, and acknowledges once.
type call struct {
	ctx     context.Context
	op      opKind
	checks  []Check
	out     []Decision
	shards  []uint16 // actor of each check
	targets []bool   // scratch for dispatch
	pending atomic.Int32
	aborted atomic.Bool
	err     atomic.Pointer[error]
	done    chan struct{} // capacity 1; signalled by the last ack

	// marks, when not nil, receives for each recorded check where its hits
	// went (state.mark), so that they can be released.
	marks []int64
	// gen is the ownership generation a fenced opCheck was routed at; 0
	// when it is not fenced.
	gen uint64
	// parts is how many actors the call was sent to; refused how many of
	// them refused their part as stale, and staleParts which ones (by
	// actor, for a fenced call sent to several).
	parts      int32
	refused    atomic.Int32
	staleParts []bool
	// count is what the actors of an opForget or an opEvict counted.
	count atomic.Int32
	// For opInspect, opReset and opList.
	view    *KeyState
	existed bool
	prefix  string
	after   string
	limit   int
	lists   [][]KeySummary
	// For opImport, opCollect, opForget and opEvict. moved picks the keys
	// of an opCollect sent to every actor, and those an opEvict drops.
	moved   func(key string) bool
	exports [][]Exported
	states  [][]byte
}

// broadcast reports whether c goes to every actor rather than to the owners
// of its keys.
func (c *call) broadcast() bool {
	return c.op == opList || c.op == opEvict || c.op == opCollect && c.moved != nil
}

func (c *call) fail(err error) { c.err.CompareAndSwap(nil, &err) }

func (c *call) errValue() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// outcome is the result of a call every actor has acknowledged: its error,
// or the refusals of its parts as stale.
func (c *call) outcome() error {
	if err := c.errValue(); err != nil {
		return err
	}
	switch n := c.refused.Load(); n {
	case 0:
		return nil
	case c.parts:
		return ErrStale
	default:
		se := &StaleError{}
		for i := range c.checks {
			if c.staleParts[c.shards[i]] {
				se.Refused = append(se.Refused, i)
			}
		}
		return se
	}
}

// ack records that one actor finished its share.
func (c *call) ack() {
	if c.pending.Add(-1) == 0 {
		c.done <- struct{}{}
	}
}

func (c *call) reset() {
	c.ctx, c.checks, c.out, c.op, c.marks, c.gen = nil, nil, nil, opCheck, nil, 0
	c.view, c.existed, c.lists = nil, false, nil
	c.staleParts = c.staleParts[:0]
	c.refused.Store(0)
	c.err.Store(nil)
	c.aborted.Store(false)
}

// CheckAll is Check with all-or-nothing semantics: the hits of the call are
// recorded only if every check is allowed. If one is denied, every decision
// says denied; the checks that fitted on their own have RetryAfter 0, and
// their hits are released, exactly those and not newer ones. Between the
// two steps other calls see the reserved hits, which can only make them
// more conservative, never let more through. Refunds and penalties are
// applied either way.
//
// CheckAll is Do with CallOptions.AllOrNothing.
func (e *Engine) CheckAll(ctx context.Context, checks []Check, out []Decision) error {
	return e.Do(ctx, checks, out, CallOptions{AllOrNothing: true})
}

// Unwind turns the decisions of a reserving call that had a denial into
// the all-or-nothing answer: every decision denied, the checks that fitted
// with their hits given back in Remaining. It returns the checks whose hits
// must be released, with their marks. Usage reports stay recorded (the
// hits were spent), and their decisions as they are.
func Unwind(checks []Check, out []Decision, marks []int64) ([]Check, []int64) {
	var release []Check
	var releaseMarks []int64
	for i := range checks {
		c := &checks[i]
		if out[i].Allowed && !c.Refund && !c.Usage && c.Cost > 0 {
			release = append(release, *c)
			releaseMarks = append(releaseMarks, marks[i])
			out[i].Remaining = min(out[i].Limit, out[i].Remaining+c.Cost)
		}
		if !c.Refund && !c.Usage {
			out[i].Allowed = false
		}
	}
	return release, releaseMarks
}

// Release takes back the hits a CheckMarked call recorded for checks, as
// marked: exactly those hits, not newer ones. It ignores the caller's
// cancellation: a release must not be lost halfway.
func (e *Engine) Release(ctx context.Context, checks []Check, marks []int64) error {
	if len(checks) == 0 {
		return nil
	}
	if len(marks) != len(checks) {
		return fmt.Errorf("actor: release: %d checks but %d marks", len(checks), len(marks))
	}
	if err := e.validate(checks, make([]Decision, len(checks))); err != nil {
		return err
	}
	rc := e.calls.Get().(*call)
	rc.ctx, rc.op, rc.checks, rc.marks = context.WithoutCancel(ctx), opRelease, checks, marks
	rc.out = make([]Decision, len(checks))
	return e.run(rc)
}

// CheckMarked is Check that also reports, in marks, where each recorded
// hit went, so that Release can take them back. It is the first step of an
// all-or-nothing call that spans nodes. It is Do with CallOptions.Marks.
func (e *Engine) CheckMarked(ctx context.Context, checks []Check, out []Decision, marks []int64) error {
	return e.Do(ctx, checks, out, CallOptions{Marks: marks})
}

// Inspect returns the live state of key as its actor sees it now. It
// records nothing and does not load the key into memory.
func (e *Engine) Inspect(ctx context.Context, key string) (KeyState, error) {
	v := KeyState{Key: key}
	if _, err := e.keyCall(ctx, opInspect, key, &v); err != nil {
		return KeyState{}, err
	}
	return v, nil
}

// Reset forgets every hit of key, in memory and on disk, and reports whether
// it held any.
func (e *Engine) Reset(ctx context.Context, key string) (bool, error) {
	return e.keyCall(ctx, opReset, key, nil)
}

func (e *Engine) keyCall(ctx context.Context, op opKind, key string, v *KeyState) (bool, error) {
	if err := validKey(0, key, e.cfg.Limits); err != nil {
		return false, err
	}
	if e.closing.Load() {
		return false, ErrClosed
	}
	c := &call{done: make(chan struct{}, 1), ctx: ctx, op: op, view: v}
	c.checks = []Check{{Key: key}}
	c.out = make([]Decision, 1)
	err, _ := e.wait(c)
	return c.existed, err
}

// List returns up to limit keys that start with prefix and sort after
// after, in key order, from memory and disk. Keys with ReservedPrefix are
// never listed, and a prefix that starts with it is refused with an
// *InvalidCheckError.
func (e *Engine) List(ctx context.Context, prefix, after string, limit int) ([]KeySummary, error) {
	if limit <= 0 {
		limit = 100
	}
	if strings.HasPrefix(prefix, ReservedPrefix) {
		return nil, &InvalidCheckError{Field: "prefix", Reason: reservedReason}
	}
	if e.closing.Load() {
		return nil, ErrClosed
	}
	c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opList, prefix: prefix, after: after, limit: limit}
	c.lists = make([][]KeySummary, len(e.actors))
	if err, _ := e.wait(c); err != nil {
		return nil, err
	}
	seen := make(map[string]bool)
	var all []KeySummary
	for _, l := range c.lists {
		for _, k := range l {
			seen[k.Key] = true
			all = append(all, k)
		}
	}
	if e.store != nil {
		now := e.cfg.Clock.Now().UnixNano()
		err := e.scanKeys(prefix, after, limit+len(all), func(key string, deadline int64) bool {
			if !seen[key] && deadline > now {
				all = append(all, KeySummary{Key: key, ExpiresAt: time.Unix(0, deadline)})
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	slices.SortFunc(all, func(a, b KeySummary) int { return strings.Compare(a.Key, b.Key) })
	if len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// scanKeys calls fn, in key order, for at most limit (> 0) keys in the
// store that start with prefix, sort after after and do not start with
// ReservedPrefix (the range of those keys is jumped over, not read); fn
// returns false to stop. It is Store.Scan for the keys clients see.
func (e *Engine) scanKeys(prefix, after string, limit int, fn func(key string, deadline int64) bool) error {
	if strings.HasPrefix(prefix, ReservedPrefix) {
		return nil
	}
	n := 0
	for {
		reserved, stop := "", false
		err := e.store.Scan(prefix, after, limit-n, func(key string, deadline int64, _ []byte) bool {
			if strings.HasPrefix(key, ReservedPrefix) {
				reserved = key
				return false
			}
			n++
			stop = !fn(key, deadline)
			return !stop
		})
		if err != nil || reserved == "" || stop || n >= limit {
			return err
		}
		// Go on after the reserved keys (after this one, should one sort
		// after reservedEnd: after always moves forward).
		after = max(reservedEnd, reserved)
	}
}

// reservedEnd sorts after every key the engine writes under ReservedPrefix
// (they all start with ReplicaPrefix) and before every key clients may use
// that sorts after them.
const reservedEnd = ReservedPrefix + "\xff"

// Exported is the encoded state of one key handed over to another node.
type Exported struct {
	Key   string
	State []byte
	// Deadline is when the state becomes empty if nothing else arrives, in
	// unix ns (the deadline its record has in the store). Set by Collect,
	// Get and CollectReplicas; Import does not read it.
	Deadline int64
	// Parts, set by Collect for a key that took in states of other
	// histories by adding them up (it holds receipts, see importStates),
	// is State split by history: first the key's own hits beyond those it
	// took in, then each history taken in, as imported. Imported one after
	// the other in place of State, they count at least what State counts,
	// and a receiver that holds one of those histories (the node that
	// handed it over and kept it, not knowing it was delivered) joins it
	// with its own copy instead of counting it twice. Nil otherwise.
	Parts [][]byte
}

// Split returns what to hand over of x: its Parts, each as a state of
// x's key, or x itself if it has none.
func (x Exported) Split() []Exported {
	if len(x.Parts) == 0 {
		return []Exported{x}
	}
	out := make([]Exported, len(x.Parts))
	for i, p := range x.Parts {
		out[i] = Exported{Key: x.Key, State: p, Deadline: x.Deadline}
	}
	return out
}

// Import merges handed-over states into their keys: the result counts at
// least what either side counted, so a handoff never frees a window. A
// state of the same lineage as the key's (a copy of the same history: a
// standby's copy, the owner's disk) merges idempotently, each hit they
// share counted once; states of different lineages add up (see merge),
// and a newer version of a state (or the same, sent again) that was added
// up with the key then adds only what it holds beyond what was taken in,
// its hits counted once, while the key is in memory (see importStates).
func (e *Engine) Import(ctx context.Context, states []Exported) error {
	for start := 0; start < len(states); start += e.cfg.Limits.MaxBatch {
		part := states[start:min(start+e.cfg.Limits.MaxBatch, len(states))]
		c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opImport}
		c.checks = make([]Check, len(part))
		c.states = make([][]byte, len(part))
		for i, x := range part {
			if err := validKey(start+i, x.Key, e.cfg.Limits); err != nil {
				return err
			}
			c.checks[i].Key, c.states[i] = x.Key, x.State
		}
		c.out = make([]Decision, len(part))
		if err, _ := e.wait(c); err != nil {
			return err
		}
	}
	return nil
}
