package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// LimitShares is what was persisted for one limit of a domain.
type LimitShares struct {
	// Shares is each region's share of the limit's default vector; nil
	// when none was ever assigned (regions use the initial split).
	Shares map[string]float64
	// HotKeys counts the keys with share vectors of their own.
	HotKeys int64
}

// Shares reads the Term and Version of domain's latest persisted Ready
// and, for each of limits, its default shares and the number of its hot
// keys. It reads one record per limit and counts the others, so its cost
// does not grow with hot keys. Each batch of 49 limits is read at one
// revision.
func (s *Store) Shares(ctx context.Context, domain string, limits []string) (term int64, version uint64, out map[string]LimitShares, err error) {
	const batch = (maxTxnOps - 1) / 2
	out = make(map[string]LimitShares, len(limits))
	for first := 0; first == 0 || first < len(limits); first += batch {
		names := limits[first:min(first+batch, len(limits))]
		ops := []clientv3.Op{clientv3.OpGet(s.metaKey(domain))}
		for _, l := range names {
			def := s.recordKey(domain, l, "")
			ops = append(ops, clientv3.OpGet(def), clientv3.OpGet(def, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, 0, nil, fmt.Errorf("shares of %s: %w", domain, err)
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			var m metaJSON
			if err := json.Unmarshal(kvs[0].Value, &m); err != nil {
				return 0, 0, nil, fmt.Errorf("%w: %s: %v", ErrBadRecord, kvs[0].Key, err)
			}
			term, version = m.Term, m.Version
		}
		for i, l := range names {
			def, count := resp.Responses[1+2*i].GetResponseRange(), resp.Responses[2+2*i].GetResponseRange()
			ls := LimitShares{HotKeys: count.Count}
			if len(def.Kvs) == 1 {
				var v recordJSON
				if err := json.Unmarshal(def.Kvs[0].Value, &v); err != nil {
					return 0, 0, nil, fmt.Errorf("%w: %s: %v", ErrBadRecord, def.Kvs[0].Key, err)
				}
				ls.Shares = make(map[string]float64, len(v.Cells))
				for _, c := range v.Cells {
					ls.Shares[c.Region] = c.Share
				}
				ls.HotKeys--
			}
			out[l] = ls
		}
	}
	return term, version, out, nil
}

// DefaultShares returns the persisted default shares of domain's limits,
// limit → region → share, leaving out those never assigned (a region's
// status page, server.AdminOptions.Shares).
func (s *Store) DefaultShares(ctx context.Context, domain string, limits []string) (map[string]map[string]float64, error) {
	_, _, ls, err := s.Shares(ctx, domain, limits)
	if err != nil {
		return nil, err
	}
	out := make(map[string]map[string]float64, len(ls))
	for l, sh := range ls {
		if sh.Shares != nil {
			out[l] = sh.Shares
		}
	}
	return out, nil
}
