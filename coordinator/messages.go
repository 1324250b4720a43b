package coordinator

import (
	"errors"
	"time"
)

// Errors for bad input. Nothing of a message is applied when one is
// returned; the Coordinator counts them in Stats.Rejected.
var (
	// ErrBadConfig is returned by New and NewApplier for a configuration or
	// persisted records they cannot start from.
	ErrBadConfig = errors.New("coordinator: bad config")
	// ErrUnknownDomain is returned for a message of another domain.
	ErrUnknownDomain = errors.New("coordinator: unknown domain")
	// ErrUnknownRegion is returned for a message from or to a region the
	// domain does not declare (or, by an Applier, for another region).
	ErrUnknownRegion = errors.New("coordinator: unknown region")
	// ErrUnknownLimit is returned for a report or an assignment naming a
	// limit the domain lacks.
	ErrUnknownLimit = errors.New("coordinator: unknown limit")
	// ErrBadValue is returned for an amount that is negative, NaN, infinite
	// or above allot.MaxAmount, a share outside [0, 1] (other than Follow
	// for a key), or an empty key.
	ErrBadValue = errors.New("coordinator: bad value")
	// ErrStale is returned for a report not later than the region's
	// previous one, an ack of an older term, and by an Applier for an
	// assignment older than the one it applied.
	ErrStale = errors.New("coordinator: stale message")
	// ErrBadVersion is returned for an ack of an assignment that was never
	// sent: a later term, or a version above the latest.
	ErrBadVersion = errors.New("coordinator: ack of an assignment never sent")
)

// Follow is the share value that makes a hot key follow its limit's
// default vector again (regional.Engine.SetKeyShare removes the key's own
// share for any negative value).
const Follow = -1.0

// Message is what a driver passes to Coordinator.Step: a Report or an Ack.
type Message interface{ message() }

// Report is one region's demand since its previous report, sent every
// report interval (about 1 s). A region reports every limit with traffic
// and, in Keys, every key it holds a share of its own for, plus every key
// that is near its allowance or had rejections: the coordinator tracks only
// the latter (hot keys), so its memory grows with hot keys, not all keys.
type Report struct {
	Domain string
	Region string
	// Instance names the enforcer instance that sent it (see Fleet); the
	// Coordinator, which knows only regions, ignores it.
	Instance string
	// At is when the region built the report; each report of a region must
	// be later than its previous one (duplicates and reordered reports are
	// refused, so demand is counted once).
	At     time.Time
	Limits []LimitDemand
}

// LimitDemand is a region's traffic for one limit since its previous report.
type LimitDemand struct {
	Limit    string
	Admitted float64 // cost admitted, all keys of the limit
	Rejected float64 // cost rejected
	Keys     []KeyDemand
}

// KeyDemand is a region's traffic for one key of a limit.
type KeyDemand struct {
	Key      string // as regional.KeyString names it; unique within the limit
	Admitted float64
	Rejected float64
	// NearLimit says the key used most of its allowance in this region.
	// A key is hot while some region reports it near its limit or with
	// rejections.
	NearLimit bool
}

// Ack tells the coordinator that Region applied the assignment of Term and
// Version, and so will never apply an older one.
type Ack struct {
	Domain  string
	Region  string
	Term    int64
	Version uint64
	// Instance and Seq, for a Fleet: the instance that applied it and the
	// latest Grant of the term it applied (0: none).
	Instance string
	Seq      uint64
	// Leaving says the instance holds nothing any more and is going away
	// (a graceful stop): what it held is reclaimable at once.
	Leaving bool
	// Released is what applying the acked assignment gave up of the
	// current window of Weighted sliding-window limits; Wanted, what the
	// shares in force after it may not use of that window, because a raise
	// counts from the next one (see Moved).
	Released []Moved
	Wanted   []Moved
	// SentAt, in a hello only: when the instance sent it, by its own
	// clock. The full grant that answers it echoes it (ClockEcho), so
	// that the instance knows its clock's offset from its first grant
	// on, before its first report.
	SentAt time.Time
}

// Moved is a quantity of one window's allowance of a Weighted
// sliding-window limit (docs/adr/0005): Value, a fraction of the limit, of
// the window that starts at Window (the coordinator's clock), for the
// limit's default vector and the keys that follow it (Key empty) or for
// one hot key's own share. In an Ack's Released it is a release: what the
// instance, by applying a lowering, will not admit of that window although
// it might have (regional.Engine.MoveShare, MoveKeyShares); in its Wanted,
// what the shares it applies may not use of that window because a raise
// counts from the next one (Engine.Wants). In a Grant it is an extra: what
// the instance may add to that window (Engine.AddExtra). A Fleet hands out
// as extras no more than it was acked as releases, per limit, key and
// window, and no more than each instance wants.
type Moved struct {
	Limit  string
	Key    string
	Window time.Time
	Value  float64
}

func (Report) message() {}
func (Ack) message()    {}

// Assignment is a message from the coordinator to one region: the shares
// it must apply. Term is the leader's election revision; Version increases
// with every assignment of the term (across regions). An assignment carries
// every share of the region that the region has not acknowledged yet, so
// one that is lost, late or duplicated does no harm: a region applies only
// an assignment later than every one it applied (see Applier).
type Assignment struct {
	Domain  string
	Region  string
	Term    int64
	Version uint64
	Shares  []Share
	// Instance and Grant are set by a Fleet: the assignment goes to that
	// instance of the region only, with its part of the region's allowance.
	Instance string
	Grant    *Grant
	// Clock is set by a Fleet once the instance has reported: it lets the
	// instance measure its clock's offset from the coordinator's
	// (ClockSync).
	Clock *ClockEcho
}

// ClockEcho echoes an instance's latest report: ReportAt is the report's
// At (the instance's clock), Received when the coordinator took it and
// Sent when it made the assignment that carries the echo (the
// coordinator's clock).
type ClockEcho struct {
	ReportAt, Received, Sent time.Time
}

// Grant is what one instance of a region may use, and until when. Seq
// increases with every grant to the instance within a term. After Expires
// (the coordinator's clock; the instance compares it with its own) the
// instance holds nothing until granted again: that is what lets the
// coordinator reclaim the part of an instance that vanished, once Expires
// plus the tolerated clock skew has passed. A Full grant's assignment
// carries every share of the region, not only the unacknowledged ones.
type Grant struct {
	Seq     uint64
	Expires time.Time
	Full    bool
	// Fresh says the grant's weights come from allowance no instance of
	// the region held before (a domain's first leader, the region's first
	// instance): they have been in force since before the current window.
	Fresh bool
	// Extras are what the instance may add to the current window, drawn
	// from other instances' releases for what it wanted (see Moved).
	Extras []Moved
	// Pooled are the Weighted sliding-window limits, of windows longer than
	// the rebalance period, whose default vector's releases the coordinator
	// pools now, PooledKeys those whose hot keys'
	// releases it pools: the instance gives up at once what a lowering of
	// one of them releases, and acks it (Ack.Released) with what it wants
	// (Ack.Wanted). A lowering of another keeps, for the window in
	// progress, what the window allowed.
	Pooled     []string
	PooledKeys []string
	// Weights are the instance's part, in [0, 1], of its region's share of
	// every split-mode local limit (Weighted): it applies share × weight to
	// the limit's default vector and to its keys, the key's share for a
	// hot key. A local limit missing from Weights has weight 0. Other
	// limits are enforced through the regional store, which every instance
	// of the region shares: their shares apply undivided.
	//
	// With Key set, a Weight is the instance's own for a hot key of such a
	// limit (one it reported near its limit or rejected), which it applies
	// to that key instead; with Rest also set, the key's rest factor, the
	// part of its weight for the limit that an instance without a weight
	// of its own for the key applies to it (1, the default: all of it). A
	// full grant carries every rest factor below 1 of the region (the
	// instance drops any other); another grant, those changed since the
	// instance's latest acked grant (1: back to the default).
	Weights []Weight
}

// Weight is an instance's part of its region's share of one limit (Key
// empty), its own of one hot key of it, or a hot key's rest factor (Rest;
// see Grant.Weights).
type Weight struct {
	Limit string
	Key   string
	Value float64
	Rest  bool
}

// KeyAware, among the weights an instance says it holds when it connects
// (Instance.Hello), says that it applies weights of their own for hot keys
// and rest factors. A Fleet sends neither to an instance that does not say
// so (an older enforcer would take them for its weights for the limits),
// and divides no key apart in a region where such an instance may hold
// share.
var KeyAware = Weight{Rest: true}

// Share is the region's share of a limit's default vector (Key empty) or
// of one hot key. Value is in [0, 1], or Follow for a key.
type Share struct {
	Limit string
	Key   string
	Value float64
	// Since, in a full grant, is when the region's default share took this
	// value (the coordinator's clock, plus the tolerated skew); zero: before
	// any instance held share. An Instance that held nothing uses it to
	// know from when the share was in force (see Reset).
	Since time.Time
	// Reset, in what an Instance returns, says that Value has been in
	// force since Since (zero: always) and nothing before: the engine
	// replaces the share's history rather than changing it from now.
	Reset bool
}

// Snapshot is the persisted state of a domain's assignments, which a new
// leader (see New) and a restarting region (see NewApplier) start from:
// the latest Record of every vector, and the Term and Version of the
// latest Ready that persisted any record. The zero Snapshot is a domain
// that never had an assignment.
type Snapshot struct {
	Term    int64
	Version uint64
	Records []Record
	// Members are the instances that may hold grants of the leader that
	// persisted them (nil: not known).
	Members []Member
}

// Record is the persisted state of one share vector: a limit's default
// vector (Key empty) or a hot key's. A Record without Cells deletes the
// vector's record: every region follows the default vector for that key
// again.
type Record struct {
	Limit string
	Key   string
	Cells []Cell
}

// Cell is one region's part of a Record.
type Cell struct {
	Region string
	// Share is the latest share sent to the region (Follow for a key that
	// follows the default vector).
	Share float64
	// Bound is at least every share of its own (not Follow) the region may
	// still be applying, as far as the leader knew when it wrote the
	// record, and at least Share. A key's region may also be following the
	// default vector, whose record bounds that.
	Bound float64
}

// Ready is what a Step or Tick asks the driver to do, in this order:
//
//  1. If Persist is not empty, persist every Record, replacing the
//     vector's previous record (or deleting it, for a Record without
//     Cells), and with them Term and Version: durably, and with a write
//     fenced by the leader's term (an etcd transaction that succeeds only
//     while the leader's election key has revision Term).
//  2. Only then send every Assignment to its region.
//
// If persisting fails, the driver must not send, and must drop this
// Coordinator: a new leader (maybe this process again, under a new term)
// starts from what was persisted. Sends may be lost, late or duplicated.
// The zero Ready asks for nothing.
type Ready struct {
	Term    int64
	Version uint64 // every assignment of this Ready or earlier has a version ≤ Version
	Persist []Record
	Send    []Assignment
	// Members, when not nil, is every instance that may hold a grant now
	// (a Fleet's, when it changed): persisted with the records, before the
	// assignments are sent, so that a new leader knows whom to wait for.
	Members []Member
}

// Member is an instance of a region that may hold a grant.
type Member struct {
	Region   string
	Instance string
}

// Stats are a Coordinator's counters and gauges, for metrics.
type Stats struct {
	Term       int64
	Version    uint64 // of the latest assignment sent
	HotKeys    int    // hot keys tracked, over all limits
	Reports    uint64 // reports applied
	Acks       uint64 // acks applied (including those of superseded assignments)
	Rebalances uint64
	Rejected   uint64 // reports and acks refused with an error
	// DroppedKeys counts hot keys not tracked because Config.MaxHotKeys
	// was reached; they follow their limit's default vector.
	DroppedKeys uint64
}
