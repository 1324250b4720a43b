package etcdstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot"
)

// Override is an override kept in etcd: a key whose lease ends when the
// override expires, so that it disappears by itself.
type Override struct {
	Domain string
	allot.Override
	Reason, Author string
	Created        time.Time
}

// PlanAssignment is a plan assignment kept in etcd.
type PlanAssignment struct {
	Domain string
	allot.PlanAssignment
	Author  string
	Created time.Time
}

type overrideJSON struct {
	Domain     string        `json:"domain"`
	Limit      string        `json:"limit,omitempty"`
	Match      []allot.Entry `json:"match"`
	Rate       string        `json:"rate,omitempty"`
	Multiplier float64       `json:"multiplier,omitempty"`
	Expires    time.Time     `json:"expires"`
	Reason     string        `json:"reason,omitempty"`
	Author     string        `json:"author,omitempty"`
	Created    time.Time     `json:"created"`
}

type assignmentJSON struct {
	Domain  string        `json:"domain"`
	Match   []allot.Entry `json:"match"`
	Plan    string        `json:"plan"`
	Author  string        `json:"author,omitempty"`
	Created time.Time     `json:"created"`
}

func (s *Store) overridesKey(domain string) string {
	k := s.prefix + "config/overrides/"
	if domain != "" {
		k += url.PathEscape(domain) + "/"
	}
	return k
}

// overrideKey is one override's key: its domain, its limit ("*" for
// every limit: no limit is named so) and its match, so that setting an
// override again for the same key replaces it.
func (s *Store) overrideKey(domain, limit string, m allot.Match) string {
	if limit == "" {
		limit = "*"
	}
	return s.overridesKey(domain) + url.PathEscape(limit) + "/" + matchID(m)
}

func (s *Store) plansKey(domain string) string {
	k := s.prefix + "config/plans/"
	if domain != "" {
		k += url.PathEscape(domain) + "/"
	}
	return k
}

func (s *Store) planKey(domain string, m allot.Match) string { return s.plansKey(domain) + matchID(m) }

// matchID names a match in a key: its entries sorted by attribute (the
// order of a match does not change what it selects), escaped so that it
// holds no '/', ',' or '=' of its own.
func matchID(m allot.Match) string {
	parts := make([]string, len(m))
	for i, e := range sortedMatch(m) {
		parts[i] = url.QueryEscape(e.Key) + "=" + url.QueryEscape(e.Value)
	}
	return strings.Join(parts, ",")
}

func sortedMatch(m allot.Match) allot.Match {
	return slices.SortedFunc(slices.Values(m), func(a, b allot.Entry) int { return cmp.Compare(a.Key, b.Key) })
}

// PutOverride stores o for ttl (at least a second; etcd may round it up to
// its minimum lease TTL), replacing the override of the same domain,
// limit and match. o.Expires should be o.Created + ttl: the engines stop
// applying it then, even before etcd deletes it. It does not validate o.
func (s *Store) PutOverride(ctx context.Context, o Override, ttl time.Duration) error {
	v := overrideJSON{Domain: o.Domain, Limit: o.Limit, Match: sortedMatch(o.Match), Multiplier: o.Multiplier,
		Expires: o.Expires, Reason: o.Reason, Author: o.Author, Created: o.Created}
	if o.Rate != (allot.Rate{}) {
		v.Rate = o.Rate.String()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("put override: %w", err)
	}
	lease, err := s.cli.Grant(ctx, max(1, int64(math.Ceil(ttl.Seconds()))))
	if err != nil {
		return fmt.Errorf("put override: grant lease: %w", err)
	}
	resp, err := s.cli.Put(ctx, s.overrideKey(o.Domain, o.Limit, o.Match), string(b), clientv3.WithLease(lease.ID), clientv3.WithPrevKV())
	if err != nil {
		s.cli.Revoke(context.WithoutCancel(ctx), lease.ID) //nolint:errcheck // it expires anyway
		return fmt.Errorf("put override: %w", err)
	}
	if prev := resp.PrevKv; prev != nil && prev.Lease != 0 {
		s.cli.Revoke(ctx, clientv3.LeaseID(prev.Lease)) //nolint:errcheck // the replaced one's lease; it expires anyway
	}
	return nil
}

// DeleteOverride deletes the override of domain, limit and m, and
// reports whether there was one.
func (s *Store) DeleteOverride(ctx context.Context, domain, limit string, m allot.Match) (bool, error) {
	resp, err := s.cli.Delete(ctx, s.overrideKey(domain, limit, m), clientv3.WithPrevKV())
	if err != nil {
		return false, fmt.Errorf("delete override: %w", err)
	}
	for _, kv := range resp.PrevKvs {
		s.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)) //nolint:errcheck // it expires anyway
	}
	return resp.Deleted > 0, nil
}

// Overrides returns the overrides of domain (every domain if empty), by
// domain, limit and match: until etcd deletes one, an expired one too. A malformed record is
// skipped and logged.
func (s *Store) Overrides(ctx context.Context, domain string) ([]Override, error) {
	resp, err := s.cli.Get(ctx, s.overridesKey(domain), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read overrides: %w", err)
	}
	var out []Override
	for _, kv := range resp.Kvs {
		if o, ok := s.decodeOverride(kv.Key, kv.Value); ok {
			out = append(out, o)
		}
	}
	return out, nil
}

func (s *Store) decodeOverride(key, value []byte) (Override, bool) {
	var v overrideJSON
	err := json.Unmarshal(value, &v)
	o := Override{Domain: v.Domain, Override: allot.Override{Limit: v.Limit, Match: v.Match, Multiplier: v.Multiplier, Expires: v.Expires},
		Reason: v.Reason, Author: v.Author, Created: v.Created}
	if err == nil && v.Rate != "" {
		o.Rate, err = allot.ParseRate(v.Rate)
	}
	if err != nil || v.Domain == "" {
		s.log.Warn("malformed override in etcd, skipped", "key", string(key), "err", err)
		return Override{}, false
	}
	return o, true
}

// PutPlanAssignment puts the requests a.Match selects on plan a.Plan,
// replacing the assignment of the same domain and match. It does not
// validate a.
func (s *Store) PutPlanAssignment(ctx context.Context, a PlanAssignment) error {
	b, err := json.Marshal(assignmentJSON{Domain: a.Domain, Match: sortedMatch(a.Match), Plan: a.Plan, Author: a.Author, Created: a.Created})
	if err != nil {
		return fmt.Errorf("put plan assignment: %w", err)
	}
	if _, err := s.cli.Put(ctx, s.planKey(a.Domain, a.Match), string(b)); err != nil {
		return fmt.Errorf("put plan assignment: %w", err)
	}
	return nil
}

// DeletePlanAssignment deletes the plan assignment of domain and m and
// reports whether there was one.
func (s *Store) DeletePlanAssignment(ctx context.Context, domain string, m allot.Match) (bool, error) {
	resp, err := s.cli.Delete(ctx, s.planKey(domain, m))
	if err != nil {
		return false, fmt.Errorf("delete plan assignment: %w", err)
	}
	return resp.Deleted > 0, nil
}

// PlanAssignments returns the plan assignments of domain (every domain if
// empty), by domain and match. A malformed record is skipped and logged.
func (s *Store) PlanAssignments(ctx context.Context, domain string) ([]PlanAssignment, error) {
	resp, err := s.cli.Get(ctx, s.plansKey(domain), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read plan assignments: %w", err)
	}
	var out []PlanAssignment
	for _, kv := range resp.Kvs {
		if a, ok := s.decodeAssignment(kv.Key, kv.Value); ok {
			out = append(out, a)
		}
	}
	return out, nil
}

func (s *Store) decodeAssignment(key, value []byte) (PlanAssignment, bool) {
	var v assignmentJSON
	if err := json.Unmarshal(value, &v); err != nil || v.Domain == "" || v.Plan == "" {
		s.log.Warn("malformed plan assignment in etcd, skipped", "key", string(key), "err", err)
		return PlanAssignment{}, false
	}
	return PlanAssignment{Domain: v.Domain, PlanAssignment: allot.PlanAssignment{Match: v.Match, Plan: v.Plan},
		Author: v.Author, Created: v.Created}, true
}
