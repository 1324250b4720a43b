package regional

import (
	"fmt"
	"time"

	"github.com/allot-dev/allot"
)

// Accessors for gateways that decide in their own process and report the
// traffic afterwards, such as Envoy's rate limit quota service
// (regional/server/rlqs.go): it sizes the token buckets it hands to
// Envoys from the limits that match a bucket, and records what the Envoys
// report.

// QuotaLimit is one limit that decides a descriptor, as QuotaLimits
// reports it.
type QuotaLimit struct {
	Limit *allot.Limit
	// Key names the descriptor's key of the limit, as KeyString does.
	Key string
	// Effective is the key's limit at the instant asked: plans and
	// overrides applied, before the region's share.
	Effective allot.Effective
	// Share is the region's share of the key: its own when it is a hot
	// key with a share of its own, else the limit's default; for a
	// sliding window, the least in force since its window began, as a
	// check would use.
	Share float64
}

// QuotaLimits appends to dst the limits of domain that decide a request
// with descriptor desc at now: those CheckItems would apply, after Envoy
// paths and replaces, shadow and unlimited ones included. It reads no key
// state and charges nothing. Its errors are Validate's
// (ErrUnknownDomain, ErrBadDescriptor). Safe for concurrent use.
func (e *Engine) QuotaLimits(now time.Time, domain string, desc allot.Descriptor, dst []QuotaLimit) ([]QuotaLimit, error) {
	items := [1]Item{{Descriptor: desc}}
	if err := validate(items[:]); err != nil {
		return dst, err
	}
	ds := e.cfg.Load().domain(domain)
	if ds == nil {
		return dst, fmt.Errorf("%w %q", ErrUnknownDomain, domain)
	}
	var inline [maxInline]work
	ws := inline[:0]
	if ds.d.EnvoyPaths {
		ws = e.matchEnvoy(ds, &items[0], ws)
	} else {
		ws = e.matchAll(ds, &items[0], ws)
	}
	for _, w := range ws {
		l := w.ls.l
		eff := allot.Effective{Rate: l.Rate, Burst: l.Burst}
		if !l.Unlimited {
			eff = ds.d.Effective(l, desc, now)
		}
		share := w.ls.shares.hist(w.key).forCheck(baseParams(l, eff), now.UnixNano())
		dst = append(dst, QuotaLimit{Limit: l, Key: KeyString(l, desc), Effective: eff, Share: share})
	}
	return dst, nil
}

// ChargeReported records requests that a gateway decided itself: admitted
// is charged to every request-counting limit of domain that matches desc,
// as Charge does (a balance may go below zero, later checks then wait),
// and admitted and rejected are added to the demand that Demand reports,
// as a check's would be, so that the coordinator sees the traffic.
// Unlimited limits are left out, as in a check. It returns Validate's
// errors, and ErrBadCost for a count outside [0, allot.MaxAmount];
// nothing is recorded then. Safe for concurrent use.
func (e *Engine) ChargeReported(now time.Time, domain string, desc allot.Descriptor, admitted, rejected int64) error {
	if rejected < 0 || rejected > allot.MaxAmount {
		return fmt.Errorf("%w: %d rejected is outside [0, %d]", ErrBadCost, rejected, int64(allot.MaxAmount))
	}
	items := [1]Item{{Descriptor: desc, Hits: admitted, OnlyUnit: true, Unit: allot.Requests}}
	var dec allot.Decision
	var inline [maxInline]work
	ws, err := e.plan(now, domain, items[:], opForce, &dec, inline[:0])
	if err != nil || len(ws) == 0 || admitted == 0 && rejected == 0 {
		return err
	}
	var ks [maxInline]uint64
	keys := ks[:0]
	for i := range ws {
		if !ws[i].skip {
			keys = append(keys, ws[i].key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	t, at := e.table, now.UnixNano()
	var locks lockSet
	locks.lock(t, keys)
	defer locks.unlock(t)
	if admitted > 0 {
		t.apply(at, items[:], ws, dec.Statuses, opForce)
	}
	for i := range ws {
		if !ws[i].skip {
			t.countReported(&ws[i], &dec.Statuses[i], desc, float64(admitted), float64(rejected))
		}
	}
	return nil
}

// countReported adds reported traffic to a work's demand, as count adds a
// check's: to its limit, and to its key when the key is tracked (some
// requests were rejected, or it has a tenth of its burst or less left,
// now or since it was first tracked; see tallyKey). The caller holds the
// shard's lock.
func (t *table) countReported(w *work, st *allot.LimitStatus, desc allot.Descriptor, admitted, rejected float64) {
	id := w.ls.shares.id
	if id < 0 {
		return
	}
	sh := &t.shards[shardOf(w.key)]
	d := sh.demandOf(id)
	d.admitted += admitted
	d.rejected += rejected
	near := !w.ls.l.Shadow && (rejected > 0 || float64(st.Remaining) <= w.p.burst/10)
	sh.tallyKey(w, desc, admitted, rejected, near)
}
