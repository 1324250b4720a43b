package regional

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/crdt"
)

// Errors of the methods that link an Engine to other regions (SetPeers,
// Inbound, Lend …); nothing is applied when one is returned.
var (
	// ErrNoPeers is returned when SetPeers was not called: the engine
	// is not part of a multi-region deployment.
	ErrNoPeers = errors.New("regional: no peers configured")
	// ErrUnknownPeer is returned for a region that is not one of the
	// peers given to SetPeers, or for a bad region list.
	ErrUnknownPeer = errors.New("regional: unknown peer region")
	// ErrNotShared is returned by Inbound for a limit that is not in
	// shared mode here.
	ErrNotShared = errors.New("regional: limit is not in shared mode")
	// ErrNotLendable is returned by Lend for a limit whose allowance is
	// not lent: shared mode, leased or exact enforcement, shadow or
	// unlimited.
	ErrNotLendable = errors.New("regional: limit does not lend")
	// ErrBadDelta is returned by Inbound for a delta that writes another
	// region's slot, or whose window is ahead of this region's clock.
	ErrBadDelta = errors.New("regional: bad delta")
)

// Tuning of cross-region sync and borrowing.
const (
	// hotFraction: a key whose own count grew by this fraction of its
	// limit since it was last published is published at the next tick
	// instead of waiting for its sync interval.
	hotFraction = 0.01
	// maxAhead is how many windows a peer's delta may be ahead of this
	// region's clock (skew); later ones are refused.
	maxAhead = 1
	// retention of the crdt stores: the current and previous windows,
	// and one more for a peer whose clock is a window ahead.
	retention = 3
	// maintainEvery spaces the sweeps of idle keys, the fallback
	// transitions and the top-K estimates.
	maintainEvery = int64(time.Second)
	// topK is how many of a limit's heaviest keys Stats reports.
	topK = 5
	// maxSidePerShard bounds the keys that one shard tracks for
	// borrowing; shared keys are bounded by the key table.
	maxNeedyPerShard = 1024
)

// peerState is what an Engine knows of its peers: set once by SetPeers.
type peerState struct {
	region string
	peers  []string // sorted, without region
	table  *table   // the engine's: hooks ignore other tables (an Enforcer's fallback)
	// side[i] holds the sync state of the keys of table shard i; it is
	// guarded by that shard's mu.
	side    [numShards]sideShard
	loanSeq atomic.Uint64 // the latest ask's id; starts at random

	mu           sync.Mutex // guards nextMaintain
	nextMaintain int64
}

// sideShard is one table shard's keys that sync with other regions.
type sideShard struct {
	shared map[uint64]*sharedKey // shared-mode keys, by key hash
	dirty  []*sharedKey          // those touched since they were last collected
	needy  map[uint64]*needyKey  // split-mode keys rejected here: they may borrow
	lent   map[uint64]*lentKey   // split-mode sliding-window keys that lent of their window
}

// limitSync is one limit's link to the other regions. Its configuration
// fields are set when it is made and never change; a reload that changes
// them makes a new one. It hangs off the limit's limitShares, so that
// reloads keep it.
type limitSync struct {
	ps             *peerState
	domain, limit  string
	shared         bool  // decided with the others' counts (mode: shared)
	borrow         bool  // split, local enforcement: borrows and lends
	period         int64 // ns: the window of the crdt store and of loans
	syncEvery      int64 // ns
	staleAfter     int64 // ns
	expected       []string
	amount         float64      // the limit's configured amount per period
	heardAll       atomic.Int64 // unix ns: every expected peer was heard since; MaxInt64 with none
	fallbackDec    atomic.Uint64
	fallbackActive atomic.Bool

	mu       sync.Mutex // guards what follows
	store    *crdt.Store
	version  uint64
	lastSeq  uint64                   // of the last delta sent
	nextMark int64                    // unix ns: when to send a mark if no delta goes out
	trackers map[string]*crdt.Tracker // by stream
	heard    map[string]int64         // by peer region: last message (unix ns)
	pending  map[string]*pendingSync  // by stream: a gap was seen, full state awaited
	loans    map[loanKey]LoanGrant    // lender: grants of loanWin, for retries
	loanWin  uint64
	topK     []KeyEstimate
	stats    SyncStats
}

type pendingSync struct {
	region       string
	since, asked int64
}

type loanKey struct {
	from string
	id   uint64
}

// SetPeers makes the engine region `region` of a multi-region deployment
// whose other regions are peers. From then on, shared-mode limits are
// decided with the counts the peers send (Inbound) and fall back to the
// region's split share while one of them is silent, and split-mode limits
// with local enforcement may borrow (LoanAsks) and lend (Lend). A peer
// counts for a domain if the domain lists it in its regions, or lists no
// regions. Before a peer is first heard it is stale: a restarted region
// starts in fallback.
//
// Call it once, before the region serves traffic: keys decided before
// keep their state in the form of their configured algorithm, which
// shared mode does not read.
func (e *Engine) SetPeers(region string, peers []string) error {
	if region == "" {
		return fmt.Errorf("%w: empty region name", ErrUnknownPeer)
	}
	ps := &peerState{region: region, table: e.table}
	// Loan ids start at random: a lender tells a retry from a new ask by
	// (region, id), and every instance of a region numbers its own asks.
	ps.loanSeq.Store(rand.Uint64() >> 1)
	for _, p := range peers {
		switch {
		case p == "" || p == region:
			return fmt.Errorf("%w: %q cannot be a peer of region %q", ErrUnknownPeer, p, region)
		case !slices.Contains(ps.peers, p):
			ps.peers = append(ps.peers, p)
		}
	}
	slices.Sort(ps.peers)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.peer.Load() != nil {
		return fmt.Errorf("%w: SetPeers was called already", ErrUnknownPeer)
	}
	e.peer.Store(ps)
	e.attachSync(e.cfg.Load())
	return nil
}

// Region returns the region given to SetPeers; "" before.
func (e *Engine) Region() string {
	if ps := e.peer.Load(); ps != nil {
		return ps.region
	}
	return ""
}

// Peers returns the peers given to SetPeers.
func (e *Engine) Peers() []string {
	if ps := e.peer.Load(); ps != nil {
		return slices.Clone(ps.peers)
	}
	return nil
}

// attachSync gives every limit of c its link to the peers, keeping the
// link of a limit whose sync configuration did not change. The caller
// holds e.mu.
func (e *Engine) attachSync(c *compiled) {
	ps := e.peer.Load()
	if ps == nil {
		return
	}
	for _, ds := range c.list {
		for _, ls := range ds.limits {
			want := newLimitSync(ps, ds.d, ls.l)
			if old := ls.shares.sync.Load(); old != nil && old.same(want) {
				continue
			}
			ls.shares.sync.Store(want)
		}
	}
}

func newLimitSync(ps *peerState, d *allot.Domain, l *allot.Limit) *limitSync {
	ss := &limitSync{
		ps: ps, domain: d.Name, limit: l.Name,
		period: int64(l.Rate.Period), syncEvery: int64(l.SyncInterval), staleAfter: int64(l.StaleAfter),
		amount:   float64(l.Rate.Amount),
		store:    crdt.NewStore(ps.region, retention),
		trackers: map[string]*crdt.Tracker{}, heard: map[string]int64{}, pending: map[string]*pendingSync{},
	}
	usable := !l.Unlimited && ss.period > 0
	ss.shared = usable && l.Mode == allot.Shared
	ss.borrow = usable && l.Mode == allot.Split && l.Enforcement == allot.Local && !l.Shadow
	if ss.syncEvery <= 0 {
		ss.syncEvery = int64(allot.DefaultSyncInterval)
	}
	if ss.staleAfter <= 0 {
		ss.staleAfter = 3 * ss.syncEvery
	}
	for _, p := range ps.peers {
		if len(d.Regions) == 0 || slices.Contains(d.Regions, p) {
			ss.expected = append(ss.expected, p)
		}
	}
	if len(ss.expected) == 0 {
		ss.heardAll.Store(math.MaxInt64)
	}
	ss.stats = SyncStats{Domain: d.Name, Limit: l.Name, Shared: ss.shared, Borrow: ss.borrow,
		Rate: l.Rate, SyncInterval: time.Duration(ss.syncEvery), StaleAfter: time.Duration(ss.staleAfter), Regions: 1 + len(ss.expected)}
	return ss
}

// same reports whether ss and o sync a limit the same way.
func (ss *limitSync) same(o *limitSync) bool {
	return ss.shared == o.shared && ss.borrow == o.borrow && ss.period == o.period && ss.syncEvery == o.syncEvery &&
		ss.staleAfter == o.staleAfter && ss.amount == o.amount && slices.Equal(ss.expected, o.expected)
}

// stale reports whether some expected peer has not been heard from for
// stale_after (or has lost deltas not yet resynced for that long).
func (ss *limitSync) stale(now int64) bool { return now-ss.heardAll.Load() > ss.staleAfter }

// window is the window id of an instant: floor(unix_ms / period_ms).
func (ss *limitSync) window(now int64) uint64 {
	if now < 0 {
		return 0
	}
	return uint64(now / ss.period)
}

// fresh returns the expected peers heard within stale_after.
func (ss *limitSync) fresh(now int64) []string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []string
	for _, p := range ss.expected {
		if h, ok := ss.heard[p]; ok && now-h <= ss.staleAfter {
			out = append(out, p)
		}
	}
	return out
}

// updateHeardAll recomputes heardAll. The caller holds ss.mu.
func (ss *limitSync) updateHeardAll() {
	if len(ss.expected) == 0 {
		return
	}
	least := int64(math.MaxInt64)
	for _, p := range ss.expected {
		least = min(least, ss.heard[p]) // never heard: 0
	}
	ss.heardAll.Store(least)
}

// syncs returns the links of the limits of the configuration in force.
func (e *Engine) syncs() []*limitSync {
	var out []*limitSync
	for _, ds := range e.cfg.Load().list {
		for _, ls := range ds.limits {
			if ss := ls.shares.sync.Load(); ss != nil {
				out = append(out, ss)
			}
		}
	}
	return out
}

// syncOf returns a limit's state and link.
func (e *Engine) syncOf(domain, limit string) (*limitState, *limitSync, error) {
	if e.peer.Load() == nil {
		return nil, nil, ErrNoPeers
	}
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return nil, nil, err
	}
	return ls, ls.shares.sync.Load(), nil
}

func (ps *peerState) isPeer(region string) bool {
	_, ok := slices.BinarySearch(ps.peers, region)
	return ok
}

// Heard records a message from a peer region at now: its limits are not
// stale until stale_after from now, except those with deltas lost and not
// yet resynced. The driver calls it for every message a peer sends,
// heartbeats included.
func (e *Engine) Heard(now time.Time, region string) {
	ps := e.peer.Load()
	if ps == nil || !ps.isPeer(region) {
		return
	}
	t := now.UnixNano()
	for _, ss := range e.syncs() {
		if !slices.Contains(ss.expected, region) {
			continue
		}
		ss.mu.Lock()
		if !ss.pendingFrom(region) && t > ss.heard[region] {
			ss.heard[region] = t
			ss.updateHeardAll()
		}
		ss.mu.Unlock()
	}
}

// pendingFrom reports whether a resync from region is awaited. The
// caller holds ss.mu.
func (ss *limitSync) pendingFrom(region string) bool {
	for _, p := range ss.pending {
		if p.region == region {
			return true
		}
	}
	return false
}

// SyncStats are the counters of one limit's dealings with the other
// regions.
type SyncStats struct {
	Domain, Limit string
	Shared        bool // decided with the other regions' counts
	Borrow        bool // borrows and lends unused allowance
	Rate          allot.Rate
	SyncInterval  time.Duration
	StaleAfter    time.Duration
	Regions       int // this one and its expected peers
	// Fallback says a peer is stale now: the limit is enforced at the
	// region's split share. Fallbacks counts the times it started;
	// FallbackDecisions, the decisions made so.
	Fallback          bool
	Fallbacks         uint64
	FallbackDecisions uint64
	// Deltas sent and received; OldDeltas were for windows already
	// dropped; Gaps, sequence gaps seen; Resyncs, full states applied.
	DeltasOut, DeltasIn, OldDeltas, Gaps, Resyncs uint64
	// Borrowing: asks sent and their outcome, grants made to peers.
	LoansAsked, LoansGranted, LoansRefused, LoansFailed, LoansExpired uint64
	Borrowed                                                          uint64 // tokens credited here
	LoansMade, LendRefused                                            uint64
	Lent                                                              uint64 // tokens deducted here for peers
	// TopK are the heaviest keys of the last complete window, heaviest
	// first, with the global total this region knows of.
	TopK []KeyEstimate
}

// KeyEstimate is one key's global usage in a complete window, as the
// sum of every region's slot this region knows of.
type KeyEstimate struct {
	Key    string
	Window uint64
	Total  float64 // every region's count
	Limit  float64 // the key's limit per window
}

// Overshoot is the estimate's admitted cost above the limit, ≥ 0.
func (k KeyEstimate) Overshoot() float64 { return max(0, k.Total-k.Limit) }

// SyncStats returns the counters of every limit of the configuration in
// force that syncs with peers, in configuration order; nil before
// SetPeers.
func (e *Engine) SyncStats() []SyncStats {
	var out []SyncStats
	for _, ss := range e.syncs() {
		ss.mu.Lock()
		st := ss.stats
		st.TopK = slices.Clone(ss.topK)
		ss.mu.Unlock()
		st.Fallback = ss.fallbackActive.Load()
		st.FallbackDecisions = ss.fallbackDec.Load()
		out = append(out, st)
	}
	return out
}

// LastHeard returns when each expected peer of a limit was last heard
// (the zero time: never), for status pages.
func (e *Engine) LastHeard(domain, limit string) map[string]time.Time {
	_, ss, err := e.syncOf(domain, limit)
	if err != nil || ss == nil {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make(map[string]time.Time, len(ss.expected))
	for _, p := range ss.expected {
		if h := ss.heard[p]; h > 0 {
			out[p] = time.Unix(0, h)
		} else {
			out[p] = time.Time{}
		}
	}
	return out
}
