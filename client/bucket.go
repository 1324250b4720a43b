package client

import (
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// bucket is one request shape (domain and descriptors) of this gateway.
// Its lease loop is regional.GatewayKey: at most two grants, the older
// spent first, the sync loop asking for a new one while the current still
// covers the requests that arrive during the call, so a renewal never
// sends traffic to the enforcer. The bucket adds the wire form and what
// the enforcer's answers said.
type bucket struct {
	// Immutable after newBucket; next is guarded by the key table's shard.
	domain string
	descs  []allot.Descriptor
	wire   []*allotv1.Descriptor
	hash   uint64
	next   *bucket

	mu   sync.Mutex
	gw   regional.GatewayKey // the lease loop (regional/gatewaylease.go)
	left int64               // what the enforcer had left, as of its latest answer
	info Decision            // the most restrictive limit, as of the last grant
	// seq counts the answers taken into left: an answer to a call sent
	// before another answer arrived may have been counted before or after
	// that one at the enforcer, so left takes the lower of the two.
	seq uint64
	// round is closed when the Lease round that moves tokens between
	// this gateway and the enforcer (a return, a grant asked) is answered;
	// nil when none is out. Until then the enforcer's Check could refuse
	// what an answer promised: the tokens are in neither place.
	round    chan struct{}
	fallback []fallbackLimit
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
	b.gw = regional.NewGatewayKey(time.Now())
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

// allowed is the answer to a request a grant covered: b.info's limit,
// its quota included, with what the grants hold and the enforcer had
// left, at most the quota (both were charged from it); the caller holds
// b.mu.
func (b *bucket) allowed() Decision {
	d := b.info
	d.Allowed = true
	d.Remaining = b.promise()
	return d
}

// promise is what the next requests of this shape may count on here:
// what the grants hold and what the enforcer has left, at most the
// quota; the caller holds b.mu. With no other traffic on the key, the
// next promise() requests pass, from the grants or from the enforcer's
// Check: a grant moves tokens from what the enforcer has left to the
// grants, a return moves them back, and a request the grants do not
// cover waits for a round that is moving tokens (Client.slow).
func (b *bucket) promise() int64 {
	r := b.tokens() + b.left
	if q := b.info.Quota; q > 0 {
		r = min(r, q)
	}
	return r
}

// answered takes what the enforcer had left by an answer to a call sent
// when b.seq was seq; the caller holds b.mu.
func (b *bucket) answered(left int64, seq uint64) {
	if b.seq != seq { // another answer came while this one's call was out
		left = min(left, b.left)
	}
	b.left = max(left, 0)
	b.seq++
}

// tokens is what the grants hold; the caller holds b.mu.
func (b *bucket) tokens() int64 { return b.gw.Held() }
