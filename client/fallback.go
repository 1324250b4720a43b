package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// fallbackLimit is one limit's on_failure policy, learned from a Lease
// answer, with the local bucket it uses when the policy is local.
type fallbackLimit struct {
	name   string
	policy allot.FailurePolicy
	amount float64 // the region's allowance per window
	window time.Duration
	local  *localBucket
}

// fallbacks converts a grant's fallback list, keeping the local buckets of
// limits that were already known (so a sync does not refill them).
func fallbacks(in []*allotv1.LeaseFallback, prev []fallbackLimit) []fallbackLimit {
	out := make([]fallbackLimit, 0, len(in))
	for _, f := range in {
		fl := fallbackLimit{name: f.GetName(), amount: f.GetRegionAmount(), window: f.GetWindow().AsDuration()}
		switch f.GetOnFailure() {
		case "open":
			fl.policy = allot.FailOpen
		case "closed":
			fl.policy = allot.FailClosed
		default:
			fl.policy = allot.FailLocal
		}
		for _, p := range prev {
			if p.name == fl.name {
				fl.local = p.local
			}
		}
		if fl.local == nil {
			fl.local = &localBucket{}
		}
		out = append(out, fl)
	}
	return out
}

// localBucket is the in-process token bucket a gateway falls back to:
// capacity and rate are the region's allowance divided by the gateways.
type localBucket struct {
	mu     sync.Mutex
	tokens float64
	at     time.Time
}

func (l *localBucket) take(now time.Time, capacity, perSecond float64, hits int64) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at.IsZero() {
		l.tokens, l.at = capacity, now
	}
	l.tokens = min(capacity, l.tokens+now.Sub(l.at).Seconds()*perSecond)
	l.at = now
	if float64(hits) <= l.tokens {
		l.tokens -= float64(hits)
		return true, 0
	}
	if perSecond <= 0 {
		return false, time.Hour
	}
	return false, time.Duration((float64(hits) - l.tokens) / perSecond * float64(time.Second))
}

// fallback decides a request no enforcer answered for, by the on_failure
// policy of every limit the bucket's last Lease answer named: open
// allows, closed rejects, local spends from a bucket of the region's
// allowance ÷ gateways. A shape never answered for follows
// Config.UnknownOnFailure.
func (c *Client) fallback(b *bucket, hits int64, cause error) Decision {
	c.stats.fallback.Add(1)
	if !errors.Is(cause, ErrUnavailable) {
		cause = fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	now := time.Now()
	b.mu.Lock()
	fls := b.fallback
	d := b.info
	b.mu.Unlock()
	d.Source, d.Err = SourceFallback, cause
	if len(fls) == 0 {
		d.Allowed = c.cfg.UnknownOnFailure != allot.FailClosed
		return d
	}
	gw := float64(max(1, c.gateways.Load()))
	d.Allowed = true
	for _, f := range fls {
		switch f.policy {
		case allot.FailOpen:
		case allot.FailClosed:
			d.Allowed = false
			d.Limit = f.name
			d.RetryAfter = max(d.RetryAfter, time.Second)
		case allot.FailLocal:
			capacity := f.amount / gw
			per := 0.0
			if f.window > 0 {
				per = capacity / f.window.Seconds()
			}
			if ok, wait := f.local.take(now, capacity, per, hits); !ok {
				d.Allowed = false
				d.Limit = f.name
				d.RetryAfter = max(d.RetryAfter, wait)
			}
		}
	}
	return d
}

// isUnavailable reports whether err is the Client's own "no enforcer".
func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// checkAnswer is one item's answer: its result or its own error.
type checkAnswer struct {
	res *allotv1.CheckResult
	err error
}

// sendChecks sends one batch of Check items. When the enforcer refuses
// the batch for a bad item (a batch fails as a whole), each item is sent
// again on its own so that the others still get their answers and the bad
// one its error.
func (c *Client) sendChecks(items []*allotv1.CheckItem) ([]checkAnswer, error) {
	out := make([]checkAnswer, len(items))
	resp, err := c.check(items)
	if err == nil {
		for i, r := range resp {
			out[i].res = r
		}
		return out, nil
	}
	if isUnavailable(err) || len(items) == 1 {
		return nil, err
	}
	for i, it := range items {
		r, err := c.check([]*allotv1.CheckItem{it})
		if err != nil {
			out[i].err = err
			continue
		}
		out[i].res = r[0]
	}
	return out, nil
}

func (c *Client) check(items []*allotv1.CheckItem) ([]*allotv1.CheckResult, error) {
	var resp *allotv1.CheckResponse
	_, err := c.call(context.Background(), func(ctx context.Context, ep *endpoint) error {
		c.stats.checkRPCs.Add(1)
		var err error
		resp, err = ep.rl.Check(ctx, &allotv1.CheckRequest{Items: items})
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.GetResults()) != len(items) {
		return nil, errors.New("client: enforcer answered a Check call with the wrong number of results")
	}
	return resp.GetResults(), nil
}
