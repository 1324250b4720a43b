package regional

import (
	"container/heap"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/allot-dev/allot"
)

// Errors returned by Reservations for bad input; nothing is charged when
// one is returned.
var (
	// ErrBadReservation is returned by Reserve, Settle and Release for
	// token counts out of range, a bad model name or TTL.
	ErrBadReservation = errors.New("regional: bad reservation")
	// ErrUnknownReservation is returned by Settle and Release for an id
	// that this instance never gave out, or forgot: settled or expired
	// longer than the grace period ago.
	ErrUnknownReservation = errors.New("regional: unknown reservation")
	// ErrTooManyReservations is returned by Reserve when MaxReservations
	// are in flight, or MaxPerKey on one of its keys, or MaxPerCaller of
	// its caller.
	ErrTooManyReservations = errors.New("regional: too many reservations in flight")
	// ErrNotOwner is returned by Settle and Release (SettleAs, ReleaseAs)
	// for a reservation another caller made. It wraps
	// ErrUnknownReservation: to anyone else, the id is unknown.
	ErrNotOwner = fmt.Errorf("%w: made by another caller", ErrUnknownReservation)
)

// Defaults of ReservationOptions.
const (
	DefaultReservationTTL  = 2 * time.Minute
	DefaultMaxTTL          = time.Hour
	DefaultGrace           = 5 * time.Minute
	DefaultMaxReservations = 1 << 20
	DefaultMaxTokens       = 1 << 24 // 16.7M: above any model's context
	// DefaultConcurrencyRetry is the Retry-After of a request rejected by
	// a concurrency cap, when no holder expires sooner: a stream's end
	// cannot be known in advance.
	DefaultConcurrencyRetry = time.Second
	maxModelLen             = 128
	maxIDLen                = 64

	// DefaultOutputSlack is how far above max_tokens a settled output may
	// be, as a fraction of max_tokens: at most twice max_tokens. Providers
	// may count more than the gateway asked for (other tokenizers,
	// reasoning or tool tokens outside max_tokens); twice bounds what a
	// settle can charge to a small multiple of what Reserve admitted
	// without failing those. A settle above it is an error.
	DefaultOutputSlack = 1.0
	// DefaultMaxDescriptorBytes bounds the bytes of the keys and values of
	// one reservation's descriptors, all together; DefaultMaxDescriptorEntries
	// their entries.
	DefaultMaxDescriptorBytes   = 4 << 10
	DefaultMaxDescriptorEntries = 64
	// DefaultMaxPerKey bounds the reservations in flight on one key of a
	// token limit (a limit's concurrency, when set, is the tighter cap);
	// DefaultMaxPerCaller those of one caller.
	DefaultMaxPerKey    = 4096
	DefaultMaxPerCaller = 1 << 16
)

// ReservationOptions configure Reservations. The zero value uses the
// defaults.
type ReservationOptions struct {
	// TTL is how long a reservation may stay unsettled when Reserve asks
	// for none; MaxTTL bounds what it may ask for.
	TTL, MaxTTL time.Duration
	// Grace is how long after its expiry (or its settlement) a
	// reservation is remembered: a late Settle still corrects the charge,
	// a repeated one is answered again.
	Grace time.Duration
	// MaxReservations bounds the reservations in flight.
	MaxReservations int
	// MaxTokens bounds max_tokens and prompt_tokens, and the input tokens
	// of a settle.
	MaxTokens int64
	// OutputSlack bounds a settled output: at most max_tokens ×
	// (1 + OutputSlack), rounded up. 0 means DefaultOutputSlack, a
	// negative value none (output ≤ max_tokens).
	OutputSlack float64
	// MaxDescriptorBytes and MaxDescriptorEntries bound one reservation's
	// descriptors: the bytes of their keys and values, and their entries,
	// all together.
	MaxDescriptorBytes, MaxDescriptorEntries int
	// MaxPerKey bounds the reservations in flight per key of a token
	// limit, MaxPerCaller per caller (ReserveRequest.Caller; callers
	// without an identity are one caller).
	MaxPerKey, MaxPerCaller int
	// MaxTenantEstimates bounds the keys whose own output estimate is
	// kept (about 200 bytes each); past it the least recently used is
	// forgotten and falls back to its limit's estimate.
	MaxTenantEstimates int
	// Quantile of recent output sizes reserved (0.9); InitialFraction of
	// max_tokens is reserved until a limit and model have MinSamples.
	Quantile        float64
	InitialFraction float64
	MinSamples      int
	// HalfLife is how fast old samples lose weight (5m).
	HalfLife time.Duration
	// MaxModels bounds the models learned per limit; the others share one
	// estimate.
	MaxModels int
	// NewSketch makes the summary of one limit and model; nil means
	// NewWindowSketch(1024).
	NewSketch func() Sketch
	// Rand draws reservation ids; nil means a generator seeded at random.
	// Ids are 128 random bits: guessing another gateway's is hopeless.
	Rand *rand.Rand
}

// ReserveRequest asks to hold tokens for one LLM call.
type ReserveRequest struct {
	Domain      string
	Descriptors []allot.Descriptor
	// PromptTokens is the input size, known before the call.
	PromptTokens int64
	// MaxTokens is the most output the call may produce (≥ 1).
	MaxTokens int64
	// Model names the model; estimates are learned per limit and model.
	Model string
	// Estimate, when > 0, is the caller's own output estimate, used
	// instead of the learned one; at most MaxTokens.
	Estimate int64
	// TTL, when > 0, replaces the default TTL; at most MaxTTL.
	TTL time.Duration
	// Caller is who asks, as the edge identified it ("" for a caller
	// without an identity: they are all one caller). Only the same caller
	// may settle or release the reservation.
	Caller string
}

// Reservation is Reserve's answer.
type Reservation struct {
	Allowed bool
	ID      string // empty when rejected
	// Reserved is what the token limits hold: prompt plus estimated
	// output, at most the smallest burst of the matching token limits.
	Reserved int64
	// Estimate is the output part of Reserved; Learned says it came from
	// settled usage rather than a fraction of MaxTokens or the caller.
	Estimate int64
	Learned  bool
	Expires  time.Time
	TTL      time.Duration
	// RetryAfter is, when rejected, how long until the request may pass.
	RetryAfter time.Duration
	// Concurrency says, when a concurrency cap rejected the request, which
	// limit's: its name and cap.
	ConcurrencyLimit string
	ConcurrencyCap   int64
	// Decision holds a status per matching limit (request limits are
	// charged one hit, token limits Reserved); Descriptor indexes
	// ReserveRequest.Descriptors.
	Decision allot.Decision
}

// State is where a reservation is in its life.
type State uint8

// States.
const (
	Active   State = iota // holding tokens, and a concurrency slot
	Settled               // Settle charged its real usage
	Released              // Release charged what was used before a cancel
	Expired               // not settled within its TTL: charged what it held
)

var stateNames = []string{"active", "settled", "released", "expired"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Settlement is the answer to Settle and Release.
type Settlement struct {
	ID       string
	State    State
	Reserved int64
	// Settled is what the reservation finally charged: real usage, or
	// Reserved if it expired and was not corrected.
	Settled     int64
	Refunded    int64 // given back to the token limits
	Overcharged int64 // charged above Reserved, even below zero
	// Late says it was settled after its expiry, within the grace
	// period: the charge was corrected from Reserved to real usage.
	Late bool
	// Repeat says an earlier Settle or Release had settled it: nothing was
	// charged by this call, and the fields are the earlier answer's.
	Repeat bool
	// Decision is the state of its token limits after the settlement
	// (empty on a Repeat).
	Decision allot.Decision
}

// ReservationStats are the counters of Reservations; token counts are
// totals since start.
type ReservationStats struct {
	Active                       int    // in flight
	Reservations, Rejections     uint64 // Reserve calls admitted / rejected
	ConcurrencyRejections        uint64 // rejected by a concurrency cap
	TenantEstimates              uint64 // estimates from the key's own samples (counted in LearnedEstimates too)
	Expired, LateSettles         uint64
	ReservedTokens               uint64 // held at admission
	SettledTokens                uint64 // charged in the end: usage and billing come from these
	RefundedTokens               uint64 // given back by settlements
	OverchargedTokens            uint64 // charged above reservations
	StoreFailures                uint64 // settlements or slot frees the regional store did not take
	LearnedEstimates, Fallbacks  uint64 // estimates from samples / from a fraction of max_tokens
	CallerEstimates, EstimateCap uint64 // estimates given by the caller / clamped to a burst
}

// Reservations holds LLM token reservations: Reserve holds prompt plus an
// estimate of the output on the matching token limits (and one hit on
// request limits), Settle charges the difference to real usage, Release
// does it for a cancelled stream, and Tick settles at their reserved
// amount those not settled before their TTL, freeing their concurrency
// slots. Concurrency caps (limit field concurrency) count reservations in
// flight per key: in memory for local limits, in the regional store for
// leased and exact ones.
//
// Reservations live in this instance's memory: Settle and Release must
// reach the instance that served Reserve (another one answers
// ErrUnknownReservation). If the instance dies, what they hold stays
// charged, and their store slots expire with their TTL.
//
// Time is an argument; the driver calls Tick every few hundred
// milliseconds. Safe for concurrent use; the zero value is not usable,
// call NewReservations.
type Reservations struct {
	engine  *Engine
	enf     *Enforcer // nil: every limit in the engine
	opts    ReservationOptions
	est     estimator
	tenants *tenantEstimates // each key's own estimate

	mu        sync.Mutex // guards what follows
	byID      map[string]*reservation
	due       deadlines // by next deadline: expiry, then forgetting
	rnd       *rand.Rand
	count     int            // active reservations
	perKey    map[uint64]int // active reservations per key of a token limit
	perCaller map[string]int // active reservations per caller

	slotMu sync.Mutex
	slots  map[uint64]int64 // in-memory concurrency: key → reservations holding a slot

	stats struct {
		reservations, rejections, concurrency, expired, late    atomic.Uint64
		reserved, settled, refunded, overcharged, storeFailures atomic.Uint64
		learned, fallbacks, caller, capped, tenant              atomic.Uint64
	}
}

// reservation is one Reserve's record. mu serialises its settlement;
// Reservations.mu guards deadline.
type reservation struct {
	mu        sync.Mutex
	id        string
	domain    string
	caller    string
	descs     []allot.Descriptor // nil once settled, or if no token limit matched
	model     string
	maxTokens int64
	reserved  int64
	expires   int64 // unix ns
	deadline  int64 // the next time Tick looks at it
	state     State
	slots     []heldSlot // held while active
	limits    []string   // the token limits matched, for learning
	keys      []uint64   // their keys, for learning and MaxPerKey
	result    Settlement // the first settlement, for repeats
}

// heldSlot is one concurrency slot a reservation holds.
type heldSlot struct {
	key   uint64 // the engine's key: in memory
	store string // the store's key; "" when in memory
}

// NewReservations returns Reservations charging through engine, or
// through enf (whose engine must be engine) when it is not nil.
func NewReservations(engine *Engine, enf *Enforcer, opts ReservationOptions) *Reservations {
	if opts.TTL <= 0 {
		opts.TTL = DefaultReservationTTL
	}
	if opts.MaxTTL <= 0 {
		opts.MaxTTL = max(DefaultMaxTTL, opts.TTL)
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.MaxReservations <= 0 {
		opts.MaxReservations = DefaultMaxReservations
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultMaxTokens
	}
	if !(opts.Quantile > 0 && opts.Quantile < 1) {
		opts.Quantile = DefaultEstimateQuantile
	}
	if !(opts.InitialFraction > 0 && opts.InitialFraction <= 1) {
		opts.InitialFraction = DefaultInitialFraction
	}
	if opts.MinSamples <= 0 {
		opts.MinSamples = DefaultMinSamples
	}
	if opts.HalfLife <= 0 {
		opts.HalfLife = DefaultHalfLife
	}
	if opts.MaxModels <= 0 {
		opts.MaxModels = DefaultMaxModels
	}
	if opts.OutputSlack == 0 {
		opts.OutputSlack = DefaultOutputSlack
	}
	if opts.MaxDescriptorBytes <= 0 {
		opts.MaxDescriptorBytes = DefaultMaxDescriptorBytes
	}
	if opts.MaxDescriptorEntries <= 0 {
		opts.MaxDescriptorEntries = DefaultMaxDescriptorEntries
	}
	if opts.MaxPerKey <= 0 {
		opts.MaxPerKey = DefaultMaxPerKey
	}
	if opts.MaxPerCaller <= 0 {
		opts.MaxPerCaller = DefaultMaxPerCaller
	}
	if opts.MaxTenantEstimates <= 0 {
		opts.MaxTenantEstimates = DefaultMaxTenantEstimates
	}
	if opts.NewSketch == nil {
		opts.NewSketch = func() Sketch { return NewWindowSketch(windowSketchSize) }
	}
	if opts.Rand == nil {
		opts.Rand = rand.New(rand.NewChaCha8([32]byte(binaryUint64s(rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()))))
	}
	return &Reservations{
		engine: engine, enf: enf, opts: opts,
		est: estimator{q: opts.Quantile, fraction: opts.InitialFraction, minN: float64(opts.MinSamples),
			halfLife: int64(opts.HalfLife), maxModel: opts.MaxModels, newSk: opts.NewSketch,
			entries: make(map[estKey]*estEntry), models: make(map[[2]string]int)},
		tenants:   newTenantEstimates(opts.Quantile, opts.MinSamples, opts.MaxTenantEstimates),
		byID:      make(map[string]*reservation),
		rnd:       opts.Rand,
		slots:     make(map[uint64]int64),
		perKey:    make(map[uint64]int),
		perCaller: make(map[string]int),
	}
}

func binaryUint64s(vs ...uint64) []byte {
	b := make([]byte, 0, 8*len(vs))
	for _, v := range vs {
		for i := range 8 {
			b = append(b, byte(v>>(8*i)))
		}
	}
	return b
}

// Options returns the options in force, defaults applied.
func (rs *Reservations) Options() ReservationOptions { return rs.opts }

// validModel accepts up to 128 bytes of printable UTF-8; "" is a model
// too (the gateway did not say).
func validModel(m string) error {
	if len(m) > maxModelLen {
		return fmt.Errorf("%w: model name of %d bytes, at most %d", ErrBadReservation, len(m), maxModelLen)
	}
	if !utf8.ValidString(m) {
		return fmt.Errorf("%w: model name is not UTF-8", ErrBadReservation)
	}
	for _, r := range m {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: model name %q has a non-printable character", ErrBadReservation, m)
		}
	}
	return nil
}

func (rs *Reservations) validate(req *ReserveRequest) error {
	switch mt := rs.opts.MaxTokens; {
	case req.MaxTokens < 1 || req.MaxTokens > mt:
		return fmt.Errorf("%w: max_tokens %d is outside [1, %d]", ErrBadReservation, req.MaxTokens, mt)
	case req.PromptTokens < 0 || req.PromptTokens > mt:
		return fmt.Errorf("%w: prompt_tokens %d is outside [0, %d]", ErrBadReservation, req.PromptTokens, mt)
	case req.Estimate < 0 || req.Estimate > req.MaxTokens:
		return fmt.Errorf("%w: estimate %d is outside [0, max_tokens %d]", ErrBadReservation, req.Estimate, req.MaxTokens)
	case req.TTL < 0 || req.TTL > rs.opts.MaxTTL:
		return fmt.Errorf("%w: ttl %v is outside [0, %v]", ErrBadReservation, req.TTL, rs.opts.MaxTTL)
	case req.Domain == "":
		return fmt.Errorf("%w: empty domain", ErrBadReservation)
	case len(req.Descriptors) == 0:
		return fmt.Errorf("%w: no descriptors", ErrBadDescriptor)
	case 2*len(req.Descriptors) > MaxItems:
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrBadDescriptor, len(req.Descriptors), MaxItems/2)
	}
	size, entries := 0, 0
	for i, d := range req.Descriptors {
		if len(d) == 0 {
			return fmt.Errorf("%w: descriptor %d is empty", ErrBadDescriptor, i)
		}
		entries += len(d)
		for _, e := range d {
			size += len(e.Key) + len(e.Value)
		}
	}
	if entries > rs.opts.MaxDescriptorEntries {
		return fmt.Errorf("%w: %d descriptor entries, at most %d in a reservation", ErrBadDescriptor, entries, rs.opts.MaxDescriptorEntries)
	}
	if size > rs.opts.MaxDescriptorBytes {
		return fmt.Errorf("%w: descriptors of %d bytes, at most %d in a reservation", ErrBadDescriptor, size, rs.opts.MaxDescriptorBytes)
	}
	if len(req.Caller) > maxCallerLen {
		return fmt.Errorf("%w: caller of %d bytes, at most %d", ErrBadReservation, len(req.Caller), maxCallerLen)
	}
	return validModel(req.Model)
}

// maxCallerLen bounds a caller's name (a certificate's URI SAN).
const maxCallerLen = 512

// maxOutput is the most output a settle of a reservation of maxTokens
// may declare.
func (rs *Reservations) maxOutput(maxTokens int64) int64 {
	if rs.opts.OutputSlack <= 0 {
		return maxTokens
	}
	return min(maxTokens+int64(math.Ceil(rs.opts.OutputSlack*float64(maxTokens))), allot.MaxAmount)
}

// tokenItems makes one item per descriptor that costs cost on token
// limits only.
func tokenItems(descs []allot.Descriptor, cost int64) []Item {
	items := make([]Item, len(descs))
	for i, d := range descs {
		items[i] = Item{Descriptor: d, Hits: cost, OnlyUnit: true, Unit: allot.Tokens}
	}
	return items
}

// keepUnit keeps, of ws[n:], the works on limits that count unit.
func keepUnit(ws []work, n int, unit allot.Unit) []work {
	kept := ws[:n]
	for _, w := range ws[n:] {
		if w.ls.l.Unit == unit {
			kept = append(kept, w)
		}
	}
	return kept
}

// Reserve holds prompt plus estimated output tokens on every token limit
// that matches the request's descriptors, and one hit on its request
// limits, if every limit admits it and every concurrency cap has room;
// otherwise it charges nothing and says when to retry.
func (rs *Reservations) Reserve(ctx context.Context, now time.Time, req ReserveRequest) (Reservation, error) {
	var out Reservation
	if err := rs.validate(&req); err != nil {
		return out, err
	}
	rs.Tick(ctx, now) // expired reservations free their slots first
	t := now.UnixNano()

	// Which token limits match, for the estimate, the burst and the caps.
	var probe allot.Decision
	ws, err := rs.engine.plan(now, req.Domain, tokenItems(req.Descriptors, 0), opCheck, &probe, nil)
	if err != nil {
		return out, err
	}
	var keys []uint64 // of the token limits, each once
	for _, w := range ws {
		if !w.ls.l.Unlimited && !slices.Contains(keys, w.key) {
			keys = append(keys, w.key)
		}
	}
	est, learned := req.Estimate, false
	if est == 0 {
		own := false
		for _, w := range ws {
			if w.ls.l.Unlimited {
				continue
			}
			// The limit's estimate, shared by its keys, held within
			// ±10 % of the key's own once it has samples of its own: other
			// tenants' settles move a tenant's estimate by at most that.
			e, l := rs.est.estimate(req.Domain, w.ls.l.Name, req.Model, req.MaxTokens, t)
			o := false
			if v, ok := rs.tenants.estimate(w.key, req.Model); ok {
				if !l {
					e = v
				} else {
					e = min(max(e, v-v/tenantBand), v+v/tenantBand)
				}
				e, l, o = min(max(e, 1), req.MaxTokens), true, true
			}
			if e > est {
				est, learned, own = e, l, o
			}
		}
		if est == 0 { // no token limit: nothing to learn from
			est = max(int64(math.Ceil(rs.opts.InitialFraction*float64(req.MaxTokens))), 1)
		}
		if learned {
			rs.stats.learned.Add(1)
		} else {
			rs.stats.fallbacks.Add(1)
		}
		if own {
			rs.stats.tenant.Add(1)
		}
	} else {
		rs.stats.caller.Add(1)
	}
	reserved := req.PromptTokens + est
	for i, w := range ws {
		if l := w.ls.l; !l.Unlimited && !l.Shadow && reserved > int64(w.p.burst) {
			if req.PromptTokens > int64(w.p.burst) {
				return out, fmt.Errorf("%w: descriptor %d: prompt of %d tokens, limit %s admits at most %d at once",
					ErrCostAboveBurst, ws[i].item, req.PromptTokens, l.Name, int64(w.p.burst))
			}
			reserved = int64(w.p.burst)
			rs.stats.capped.Add(1)
		}
	}
	est = reserved - req.PromptTokens

	ttl := req.TTL
	if ttl == 0 {
		ttl = rs.opts.TTL
	}
	rs.mu.Lock()
	if err := rs.openLocked(req.Caller, keys); err != nil {
		rs.mu.Unlock()
		return out, err
	}
	// Held from here; given back if rejected.
	id := rs.newID()
	rs.mu.Unlock()
	admitted := false
	defer func() {
		if !admitted {
			rs.mu.Lock()
			rs.closeLocked(req.Caller, keys)
			rs.mu.Unlock()
		}
	}()

	r := &reservation{id: id, domain: req.Domain, caller: req.Caller, descs: req.Descriptors, model: req.Model,
		maxTokens: req.MaxTokens, reserved: reserved, expires: t + int64(ttl), state: Active, keys: keys}
	for _, w := range ws {
		if !w.ls.l.Unlimited && !containsString(r.limits, w.ls.l.Name) {
			r.limits = append(r.limits, w.ls.l.Name)
		}
	}
	if len(r.limits) == 0 {
		// No token limit: a settlement has nothing to correct, so the
		// descriptors are not kept (what it holds is this record alone,
		// counted against MaxPerCaller and MaxReservations).
		r.descs = nil
	}

	// Concurrency first: a request it rejects is charged nothing.
	slots, rejected, retry, err := rs.acquire(ctx, now, req.Domain, tokenItems(req.Descriptors, 0), ws, id, ttl)
	if err != nil {
		return out, err
	}
	if rejected >= 0 {
		w := &ws[rejected]
		out.Decision = probe
		for i := range out.Decision.Statuses {
			if st := &out.Decision.Statuses[i]; st.Name == w.ls.l.Name && st.Descriptor == w.item {
				st.Allowed, st.RetryAfter = false, retry
			}
		}
		out.Decision.Allowed, out.Decision.RetryAfter = false, retry
		out.RetryAfter, out.ConcurrencyLimit, out.ConcurrencyCap = retry, w.ls.l.Name, w.ls.l.Concurrency
		rs.stats.rejections.Add(1)
		rs.stats.concurrency.Add(1)
		return out, nil
	}
	r.slots = slots

	items := make([]Item, 0, 2*len(req.Descriptors))
	for _, d := range req.Descriptors {
		items = append(items,
			Item{Descriptor: d, Hits: 1, OnlyUnit: true, Unit: allot.Requests},
			Item{Descriptor: d, Hits: reserved, OnlyUnit: true, Unit: allot.Tokens})
	}
	if rs.enf != nil {
		err = rs.enf.CheckItems(ctx, now, req.Domain, items, &out.Decision)
	} else {
		err = rs.engine.CheckItems(now, req.Domain, items, &out.Decision)
	}
	for i := range out.Decision.Statuses {
		out.Decision.Statuses[i].Descriptor /= 2
	}
	if err != nil || !out.Decision.Allowed {
		rs.free(ctx, now, id, r.slots)
		if err != nil {
			return Reservation{}, err
		}
		out.RetryAfter = out.Decision.RetryAfter
		rs.stats.rejections.Add(1)
		return out, nil
	}

	rs.mu.Lock()
	rs.byID[id] = r
	rs.setDeadline(r, r.expires, true)
	rs.mu.Unlock()
	admitted = true
	rs.stats.reservations.Add(1)
	rs.stats.reserved.Add(uint64(reserved))
	out.Allowed, out.ID, out.Reserved, out.Estimate, out.Learned = true, id, reserved, est, learned
	out.TTL, out.Expires = ttl, time.Unix(0, r.expires)
	return out, nil
}

// openLocked counts a reservation of caller on keys in flight, if
// MaxReservations, MaxPerCaller and MaxPerKey leave room. The caller
// holds rs.mu.
func (rs *Reservations) openLocked(caller string, keys []uint64) error {
	if rs.count >= rs.opts.MaxReservations {
		return fmt.Errorf("%w: %d in this instance", ErrTooManyReservations, rs.opts.MaxReservations)
	}
	if n := rs.perCaller[caller]; n >= rs.opts.MaxPerCaller {
		return fmt.Errorf("%w: %d of caller %q, at most %d", ErrTooManyReservations, n, callerName(caller), rs.opts.MaxPerCaller)
	}
	for _, k := range keys {
		if n := rs.perKey[k]; n >= rs.opts.MaxPerKey {
			return fmt.Errorf("%w: %d on one key, at most %d", ErrTooManyReservations, n, rs.opts.MaxPerKey)
		}
	}
	rs.count++
	rs.perCaller[caller]++
	for _, k := range keys {
		rs.perKey[k]++
	}
	return nil
}

// closeLocked undoes openLocked. The caller holds rs.mu.
func (rs *Reservations) closeLocked(caller string, keys []uint64) {
	rs.count--
	if rs.perCaller[caller]--; rs.perCaller[caller] <= 0 {
		delete(rs.perCaller, caller)
	}
	for _, k := range keys {
		if rs.perKey[k]--; rs.perKey[k] <= 0 {
			delete(rs.perKey, k)
		}
	}
}

func callerName(c string) string {
	if c == "" {
		return "(anonymous)"
	}
	return c
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// newID draws a reservation id. The caller holds rs.mu.
func (rs *Reservations) newID() string {
	var b [16]byte
	for {
		for i := 0; i < 16; i += 8 {
			v := rs.rnd.Uint64()
			for j := range 8 {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		id := "rsv_" + hex.EncodeToString(b[:])
		if rs.byID[id] == nil {
			return id
		}
	}
}

// Settle charges a reservation's real usage, input plus output tokens:
// the unused part of what it holds goes back, usage above it is charged
// even below zero (the next requests wait). The output size is learned
// for the next estimates. A reservation that expired is corrected from
// its reserved amount within the grace period. Settling again, or after
// Release, charges nothing and returns the first answer.
//
// Settle acts as the anonymous caller (ReserveRequest.Caller ""); see
// SettleAs. Input must be at most MaxTokens, output at most the
// reservation's max_tokens with OutputSlack; otherwise it returns
// ErrBadReservation and changes nothing: the reservation stays as it was.
func (rs *Reservations) Settle(ctx context.Context, now time.Time, id string, input, output int64) (Settlement, error) {
	return rs.SettleAs(ctx, now, "", id, input, output)
}

// SettleAs is Settle for caller, who must be the one that made the
// reservation (ErrNotOwner otherwise).
func (rs *Reservations) SettleAs(ctx context.Context, now time.Time, caller, id string, input, output int64) (Settlement, error) {
	if input < 0 || output < 0 || input > rs.opts.MaxTokens || output > allot.MaxAmount {
		return Settlement{}, fmt.Errorf("%w: input_tokens %d must be in [0, %d], output_tokens %d in [0, max_tokens]",
			ErrBadReservation, input, rs.opts.MaxTokens, output)
	}
	return rs.finish(ctx, now, caller, id, input, output, Settled)
}

// Release ends a cancelled stream's reservation: used (the tokens used so
// far, prompt included) is charged as Settle charges real usage. It
// teaches the estimate nothing, since the output was cut short. Used is
// bounded as Settle's input plus output are.
//
// Release acts as the anonymous caller; see ReleaseAs.
func (rs *Reservations) Release(ctx context.Context, now time.Time, id string, used int64) (Settlement, error) {
	return rs.ReleaseAs(ctx, now, "", id, used)
}

// ReleaseAs is Release for caller, who must be the one that made the
// reservation (ErrNotOwner otherwise).
func (rs *Reservations) ReleaseAs(ctx context.Context, now time.Time, caller, id string, used int64) (Settlement, error) {
	if used < 0 || used > allot.MaxAmount {
		return Settlement{}, fmt.Errorf("%w: used tokens %d must be in [0, %d]", ErrBadReservation, used, int64(allot.MaxAmount))
	}
	return rs.finish(ctx, now, caller, id, used, -1, Released)
}

// finish settles (output ≥ 0: input and output) or releases (output
// −1: input is what was used) reservation id for caller.
func (rs *Reservations) finish(ctx context.Context, now time.Time, caller, id string, input, output int64, to State) (Settlement, error) {
	if id == "" || len(id) > maxIDLen {
		return Settlement{}, fmt.Errorf("%w: reservation id of %d bytes, want 1 to %d", ErrBadReservation, len(id), maxIDLen)
	}
	rs.mu.Lock()
	r := rs.byID[id]
	rs.mu.Unlock()
	if r == nil {
		return Settlement{}, fmt.Errorf("%w %q: never given out here, or settled or expired more than %v ago",
			ErrUnknownReservation, id, rs.opts.Grace)
	}
	if r.caller != caller { // immutable: no lock needed
		return Settlement{}, fmt.Errorf("%w: reservation %q, caller %s", ErrNotOwner, id, callerName(caller))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == Settled || r.state == Released {
		res := r.result
		res.Repeat, res.Decision = true, allot.Decision{Allowed: true}
		return res, nil
	}
	// Bounds that depend on the reservation, checked before anything
	// changes: an error leaves it as it was (a repeat above charges
	// nothing, whatever it says).
	used, err := rs.used(r, input, output)
	if err != nil {
		return Settlement{}, err
	}
	switch r.state {
	case Active:
		rs.free(ctx, now, r.id, r.slots)
		r.slots = nil
		rs.mu.Lock()
		rs.closeLocked(r.caller, r.keys)
		rs.mu.Unlock()
	case Expired:
		rs.stats.late.Add(1)
		// It was counted as settled at its reserved amount: take that back.
		if r.reserved > 0 {
			rs.stats.settled.Add(^uint64(r.reserved - 1))
		}
	}
	res := Settlement{ID: id, State: to, Reserved: r.reserved, Settled: used, Late: r.state == Expired}
	delta := used - r.reserved
	switch {
	case delta < 0:
		res.Refunded = -delta
		err = rs.refund(ctx, now, r.domain, tokenItems(r.descs, -delta), &res.Decision)
	case delta > 0:
		res.Overcharged = delta
		err = rs.charge(ctx, now, r.domain, tokenItems(r.descs, delta), &res.Decision)
	default:
		err = rs.refund(ctx, now, r.domain, tokenItems(r.descs, 0), &res.Decision)
	}
	if err != nil && !errors.Is(err, ErrUnknownDomain) { // a domain removed by a reload: nothing to charge
		rs.stats.storeFailures.Add(1)
	}
	if output >= 0 {
		for _, l := range r.limits {
			rs.est.observe(r.domain, l, r.model, output, now.UnixNano())
		}
		for _, k := range r.keys {
			rs.tenants.observe(k, r.model, output)
		}
	}
	rs.stats.settled.Add(uint64(used))
	rs.stats.refunded.Add(uint64(res.Refunded))
	rs.stats.overcharged.Add(uint64(res.Overcharged))

	r.state, r.descs = to, nil
	r.result = res
	r.result.Decision = allot.Decision{}
	rs.mu.Lock()
	rs.setDeadline(r, now.UnixNano()+int64(rs.opts.Grace), false)
	rs.mu.Unlock()
	return res, nil
}

// used is what settling r with input and output (−1: releasing it with
// input used) charges, or ErrBadReservation if r could not have used
// that much: output above max_tokens and its slack, a release above
// MaxTokens of prompt and that output, or a total above the accounting
// cap (allot.MaxAmount).
func (rs *Reservations) used(r *reservation, input, output int64) (int64, error) {
	used, maxOut := input, rs.maxOutput(r.maxTokens)
	if output >= 0 {
		if output > maxOut {
			return 0, fmt.Errorf("%w: output_tokens %d above the reservation's max_tokens %d (with slack: at most %d)",
				ErrBadReservation, output, r.maxTokens, maxOut)
		}
		used = input + output
	} else if most := rs.opts.MaxTokens + maxOut; used > most {
		return 0, fmt.Errorf("%w: used tokens %d above what the reservation could use: prompt up to %d, output up to %d",
			ErrBadReservation, used, rs.opts.MaxTokens, maxOut)
	}
	if used > allot.MaxAmount {
		return 0, fmt.Errorf("%w: input and output of %d tokens, above the accounting cap of %d",
			ErrBadReservation, used, int64(allot.MaxAmount))
	}
	return used, nil
}

// refund gives tokens back where Reserve charged them.
func (rs *Reservations) refund(ctx context.Context, now time.Time, domain string, items []Item, dec *allot.Decision) error {
	if rs.enf != nil {
		return rs.enf.RefundItems(ctx, now, domain, items, dec)
	}
	return rs.engine.RefundItems(now, domain, items, dec)
}

// charge charges usage above a reservation, even below zero.
func (rs *Reservations) charge(ctx context.Context, now time.Time, domain string, items []Item, dec *allot.Decision) error {
	if rs.enf != nil {
		return rs.enf.chargeItems(ctx, now, domain, items, dec)
	}
	return rs.engine.do(now, domain, items, opForce, dec)
}

// Tick settles, at their reserved amount, the reservations whose TTL has
// passed, freeing their concurrency slots, and forgets those settled or
// expired more than the grace period ago. It returns how many expired.
func (rs *Reservations) Tick(ctx context.Context, now time.Time) int {
	n := 0
	for {
		k := rs.tick(ctx, now)
		if k == 0 {
			return n
		}
		n += k // expired ones may be due to be forgotten too
	}
}

func (rs *Reservations) tick(ctx context.Context, now time.Time) int {
	t := now.UnixNano()
	var expire []*reservation
	rs.mu.Lock()
	for len(rs.due) > 0 && rs.due[0].at <= t {
		d := heap.Pop(&rs.due).(due)
		r := d.r
		switch {
		case r.deadline != d.at:
			// moved: a later entry stands for it
		case d.expire:
			expire = append(expire, r)
		default:
			delete(rs.byID, r.id)
		}
	}
	rs.mu.Unlock()
	n := 0
	for _, r := range expire {
		r.mu.Lock()
		if r.state == Active {
			rs.free(ctx, now, r.id, r.slots)
			r.slots, r.state = nil, Expired
			r.result = Settlement{ID: r.id, State: Expired, Reserved: r.reserved, Settled: r.reserved}
			rs.stats.expired.Add(1)
			rs.stats.settled.Add(uint64(r.reserved))
			rs.mu.Lock()
			rs.closeLocked(r.caller, r.keys)
			rs.setDeadline(r, r.expires+int64(rs.opts.Grace), false)
			rs.mu.Unlock()
			n++
		}
		r.mu.Unlock()
	}
	return n
}

// setDeadline makes Tick look at r at `at`: to expire it, or to forget
// it. The caller holds rs.mu.
func (rs *Reservations) setDeadline(r *reservation, at int64, expire bool) {
	r.deadline = at
	heap.Push(&rs.due, due{at: at, r: r, expire: expire})
}

// Stats returns the counters.
func (rs *Reservations) Stats() ReservationStats {
	rs.mu.Lock()
	active := rs.count
	rs.mu.Unlock()
	s := &rs.stats
	return ReservationStats{
		Active: active, Reservations: s.reservations.Load(), Rejections: s.rejections.Load(),
		ConcurrencyRejections: s.concurrency.Load(), Expired: s.expired.Load(), LateSettles: s.late.Load(),
		ReservedTokens: s.reserved.Load(), SettledTokens: s.settled.Load(), RefundedTokens: s.refunded.Load(),
		OverchargedTokens: s.overcharged.Load(), StoreFailures: s.storeFailures.Load(),
		TenantEstimates: s.tenant.Load(), LearnedEstimates: s.learned.Load(), Fallbacks: s.fallbacks.Load(), CallerEstimates: s.caller.Load(), EstimateCap: s.capped.Load(),
	}
}

// Estimate returns the output tokens Reserve would hold now for a
// request of maxTokens on a limit and model, and whether it is learned.
func (rs *Reservations) Estimate(now time.Time, domain, limit, model string, maxTokens int64) (int64, bool) {
	return rs.est.estimate(domain, limit, model, maxTokens, now.UnixNano())
}

// due is a deadline in the heap.
type due struct {
	at     int64
	r      *reservation
	expire bool // expire it; else forget it
}

type deadlines []due

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].at < d[j].at }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(due)) }
func (d *deadlines) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}
