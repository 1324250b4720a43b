package client

import (
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

type bucketState uint8

const (
	stateNew       bucketState = iota // no Lease answer yet: requests go to Check
	stateLeased                       // decided from leases
	stateCheckEach                    // an exact limit matches: every request goes to Check
	stateUnlimited                    // no limit matches: every request passes
)

// bucket is one request shape (domain and descriptors) of this gateway.
// It holds at most two grants: requests spend the older first, and the
// sync loop asks for a new one while the current still covers the
// requests that arrive during the call, so a renewal never sends traffic
// to the enforcer.
type bucket struct {
	// Immutable after newBucket; next is guarded by the key table's shard.
	domain string
	descs  []allot.Descriptor
	wire   []*allotv1.Descriptor
	hash   uint64
	next   *bucket

	mu          sync.Mutex
	state       bucketState
	hold        regional.LeaseHold // the grants (regional/gatewaylease.go)
	left        int64              // what the enforcer had left after the last grant
	spent       int64              // spent from grants since the last report
	asked       int64              // hits sent to Check since the last sync
	maxHits     int64              // the largest request seen since the last sync
	rate        float64            // hits per second: average over sync intervals
	lastSync    time.Time          // when rate was last updated
	lastUse     time.Time
	probed      time.Time // last Lease answer
	needLease   bool      // a request found no lease: take one now
	deniedUntil time.Time // the enforcer said nothing is left until then
	info        Decision  // the most restrictive limit, as of the last grant
	fallback    []fallbackLimit
}

func newBucket(domain string, ds []allot.Descriptor) *bucket {
	b := &bucket{domain: domain, descs: make([]allot.Descriptor, len(ds)), wire: make([]*allotv1.Descriptor, len(ds))}
	for i, d := range ds {
		b.descs[i] = slices.Clone(d)
		w := &allotv1.Descriptor{Entries: make([]*allotv1.Entry, len(d))}
		for j, e := range d {
			w.Entries[j] = &allotv1.Entry{Key: e.Key, Value: e.Value}
		}
		b.wire[i] = w
	}
	now := time.Now()
	b.lastSync, b.lastUse = now, now
	return b
}

// is reports whether b is the bucket of (domain, ds).
func (b *bucket) is(domain string, ds []allot.Descriptor) bool {
	if b.domain != domain || len(b.descs) != len(ds) {
		return false
	}
	for i, d := range ds {
		if !slices.Equal(b.descs[i], d) {
			return false
		}
	}
	return true
}

// take spends hits from the grants, older first; the caller holds b.mu.
func (b *bucket) take(hits int64) bool {
	if b.state != stateLeased || !b.hold.Take(hits) {
		return false
	}
	b.spent += hits
	return true
}

// allowed is the answer to a request a grant covered; the caller holds
// b.mu.
func (b *bucket) allowed() Decision {
	d := b.info
	d.Allowed = true
	d.Remaining = b.tokens() + b.left
	return d
}

// tokens is what the grants hold; the caller holds b.mu.
func (b *bucket) tokens() int64 { return b.hold.Held() }
