package allot

import (
	"strings"
	"time"
)

// Entry is one attribute of a request: tenant=acme.
type Entry struct {
	Key   string `json:"key" yaml:"key"`
	Value string `json:"value" yaml:"value"`
}

// Descriptor is a request's attributes, in the order the gateway sends them
// (Envoy's term): tenant=acme, user=42, route=/v1/chat. The nil Descriptor
// has no attributes and matches only limits with an empty match.
type Descriptor []Entry

// Get returns the value of key and whether it is present.
func (d Descriptor) Get(key string) (string, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return "", false
}

// String formats d as "k1=v1,k2=v2".
func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// Wildcard is the match value that accepts any value of an attribute. A
// value ending in "*" ("/v1/*") accepts any value with that prefix.
const Wildcard = "*"

// Match is the part of a limit that selects requests: an ordered list of
// attributes that must all be present. Its value is exact, "*" (any) or a
// prefix ending in "*". Every distinct combination of matched values is one
// key of the limit: match {tenant: "*", user: "*"} counts each user within
// each tenant, as Envoy's nested descriptors do. The empty Match matches
// every request with one key for all of them.
type Match []Entry

// Matches reports whether every attribute of m is present in d with an
// accepted value. It does not allocate.
func (m Match) Matches(d Descriptor) bool {
	for _, want := range m {
		v, ok := d.Get(want.Key)
		if !ok || !MatchValue(want.Value, v) {
			return false
		}
	}
	return true
}

// MatchValue reports whether value v is accepted by pattern: exact, "*"
// (any value) or a prefix ending in "*".
func MatchValue(pattern, v string) bool {
	if n := len(pattern); n > 0 && pattern[n-1] == '*' {
		return strings.HasPrefix(v, pattern[:n-1])
	}
	return pattern == v
}

// Specificity orders matches: more attributes, then fewer wildcards, is more
// specific. Overrides and plan assignments use the most specific one.
func (m Match) Specificity() int {
	s := 0
	for _, e := range m {
		s += 2
		if strings.HasSuffix(e.Value, "*") {
			s--
		}
	}
	return s
}

// String formats m as "k1=v1,k2=v2".
func (m Match) String() string { return Descriptor(m).String() }

// Unit is what a limit counts.
type Unit uint8

// Units.
const (
	Requests Unit = iota // each request costs its hits (default 1)
	Tokens               // LLM tokens: reserved at admission, settled later
)

// Algorithm is how one key's budget is kept.
type Algorithm uint8

// Algorithms.
const (
	TokenBucket   Algorithm = iota // cost-weighted, lazy refill; may go negative on settle
	GCRA                           // generic cell rate: one timestamp per key
	SlidingWindow                  // current + weighted previous fixed window
)

// Mode is how regions share one global limit.
type Mode uint8

// Modes.
const (
	Split  Mode = iota // each region enforces its share exactly; Σ shares ≤ 1
	Shared             // each region enforces L minus the others' known usage
)

// Enforcement is how instances of one region share the region's allowance.
type Enforcement uint8

// Enforcements.
const (
	Local  Enforcement = iota // in-process bucket
	Leased                    // batches of tokens leased from the regional store
	Exact                     // one regional store call per decision
)

// FailurePolicy says what happens when the regional store is unreachable.
type FailurePolicy uint8

// Failure policies.
const (
	FailLocal  FailurePolicy = iota // in-process bucket of share ÷ instances
	FailOpen                        // allow
	FailClosed                      // reject
)

var (
	unitNames      = []string{"requests", "tokens"}
	algorithmNames = []string{"token_bucket", "gcra", "sliding_window"}
	modeNames      = []string{"split", "shared"}
	enforceNames   = []string{"local", "leased", "exact"}
	failureNames   = []string{"local", "open", "closed"}
)

func enumString(names []string, i uint8) string {
	if int(i) < len(names) {
		return names[i]
	}
	return "unknown"
}

func (u Unit) String() string          { return enumString(unitNames, uint8(u)) }
func (a Algorithm) String() string     { return enumString(algorithmNames, uint8(a)) }
func (m Mode) String() string          { return enumString(modeNames, uint8(m)) }
func (e Enforcement) String() string   { return enumString(enforceNames, uint8(e)) }
func (f FailurePolicy) String() string { return enumString(failureNames, uint8(f)) }

// Limit is one rule of a domain: which requests it matches and how much it
// allows. Limits are built by the config loader, which applies defaults and
// validates them; treat a loaded Limit as read-only.
type Limit struct {
	Name        string
	Match       Match
	Unit        Unit
	Rate        Rate
	Burst       int64 // bucket capacity; defaults to Rate.Amount
	Algorithm   Algorithm
	Mode        Mode
	Enforcement Enforcement
	// Floors is the minimum share per region; the floors sum to at most 1.
	Floors    map[string]float64
	OnFailure FailurePolicy
	// Shadow limits are evaluated and counted but never reject.
	Shadow bool
	// Concurrency caps in-flight reservations per key; 0 means no cap.
	Concurrency int64
	// Unlimited limits match and answer but never count or reject (Envoy's
	// unlimited: a way to exempt keys from a wider limit with Replaces).
	Unlimited bool
	// Replaces names limits that this one replaces when both match the
	// same descriptor (Envoy's replaces).
	Replaces []string
	// SyncInterval is how often shared-mode deltas are sent (default 250ms).
	SyncInterval time.Duration
	// StaleAfter is when a silent peer makes shared mode fall back to split
	// (default 3 × SyncInterval).
	StaleAfter time.Duration
}

// Plan is a tier: a tenant's plan multiplies its limits.
type Plan struct {
	Name       string
	Multiplier float64
	// Floors is the least rate the plan promises on each named limit;
	// validation refuses a configuration in which the plan's multiplier
	// would set the limit below it (see plans.go).
	Floors map[string]Rate
}

// PlanAssignment puts the requests that match Match (e.g. tenant=acme) on
// plan Plan.
type PlanAssignment struct {
	Match Match
	Plan  string
}

// Override changes one key's limit for a time: user=42 ×5 for 2h. Exactly
// one of Rate and Multiplier is set. An Override with a zero Expires never
// expires.
type Override struct {
	// Limit names the limit it applies to; empty means every matching limit.
	Limit      string
	Match      Match
	Rate       Rate    // absolute: replaces the limit's rate (and scales burst)
	Multiplier float64 // relative: multiplies rate and burst
	Expires    time.Time
}

// Active reports whether o is in force at now.
func (o Override) Active(now time.Time) bool {
	return o.Expires.IsZero() || now.Before(o.Expires)
}

// Effective is a key's limit after its plan multiplier and overrides.
type Effective struct {
	Rate  Rate
	Burst int64
}

// LimitStatus is one matching limit's part of a decision.
type LimitStatus struct {
	Descriptor int // index of the request's descriptor it answers for
	Name       string
	Allowed    bool          // this limit alone would admit the request
	Shadow     bool          // a shadow limit never rejects; Allowed says what it would do
	Limit      int64         // the key's effective limit (amount per period)
	Window     time.Duration // the effective limit's period
	Remaining  int64         // what this region would still admit now, after this decision
	// ResetAfter is when the key's state is back to full if nothing more is charged.
	ResetAfter time.Duration
	// RetryAfter is how long until the same request would pass; 0 when allowed.
	RetryAfter time.Duration
}

// Decision is the answer to one check. Statuses has one entry per matching
// limit, in configuration order; callers may reuse a Decision to avoid
// allocating (Statuses is appended to from length 0).
type Decision struct {
	Allowed    bool
	RetryAfter time.Duration // largest RetryAfter of the limits that rejected
	Statuses   []LimitStatus
}

// Assignment is the coordinator's split of one key (or of a whole limit,
// when Key is empty) among regions. Shares sum to at most 1. Term is the
// leader's election revision and fences older leaders; Version orders the
// assignments of one term.
type Assignment struct {
	Domain  string
	Limit   string
	Key     string // empty: the limit's default vector
	Term    int64
	Version uint64
	Shares  map[string]float64
}

// Demand is one region's report of a key's (or a limit's) recent traffic.
type Demand struct {
	Domain   string
	Limit    string
	Key      string // empty: the whole limit
	Region   string
	At       time.Time
	Admitted float64 // cost admitted since the last report
	Rejected float64 // cost rejected since the last report
	// NearLimit says the key used most of its allowance, or was rejected,
	// in this region since the last report: it is hot.
	NearLimit bool
}
