package etcdstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/coordinator"
)

const (
	maxTxnOps   = 100       // etcd's default --max-txn-ops is 128
	maxTxnBytes = 512 << 10 // etcd's default --max-request-bytes is 1.5 MiB
	pageSize    = 5000      // records per range request in Snapshot
)

type metaJSON struct {
	Term    int64  `json:"term"`
	Version uint64 `json:"version"`
}

type recordJSON struct {
	Limit string     `json:"limit"`
	Key   string     `json:"key,omitempty"`
	Cells []cellJSON `json:"cells"`
}

type memberJSON struct {
	Region   string `json:"region"`
	Instance string `json:"instance"`
}

type cellJSON struct {
	Region string  `json:"region"`
	Share  float64 `json:"share"`
	Bound  float64 `json:"bound"`
}

// Persist writes r's records, its Members when not nil, and then its Term
// and Version (when it has records) under domain,
// in transactions fenced by l: each succeeds only while l's election key
// has create revision l.Term. A Record without Cells deletes the vector's
// record. A Ready without records writes nothing (its assignments repeat
// what was persisted). It returns ErrNotLeader when the fence fails, the
// domain is not l's, or r is not of l's term; the driver must then send
// nothing and step down. On any error, some records may have been written
// (see the package documentation for why that is safe).
func (s *Store) Persist(ctx context.Context, l *Leadership, domain string, r coordinator.Ready) error {
	switch {
	case domain != l.Domain:
		return fmt.Errorf("%w: persist to domain %q with the leadership of %q", ErrNotLeader, domain, l.Domain)
	case r.Term != l.Term:
		return fmt.Errorf("%w: Ready of term %d, leadership of term %d", ErrNotLeader, r.Term, l.Term)
	case len(r.Persist) == 0 && r.Members == nil:
		return nil
	}
	ops := make([]clientv3.Op, 0, len(r.Persist)+1)
	sizes := make([]int, 0, len(r.Persist)+1)
	at := make(map[string]int, len(r.Persist)) // a later record of a vector replaces an earlier one
	for _, rec := range r.Persist {
		k := s.recordKey(domain, rec.Limit, rec.Key)
		op, n := clientv3.OpDelete(k), len(k)
		if len(rec.Cells) > 0 {
			v := recordJSON{Limit: rec.Limit, Key: rec.Key, Cells: make([]cellJSON, len(rec.Cells))}
			for i, c := range rec.Cells {
				v.Cells[i] = cellJSON(c)
			}
			b, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("%w: %s %q: %v", ErrBadRecord, rec.Limit, rec.Key, err)
			}
			op, n = clientv3.OpPut(k, string(b)), n+len(b)
		}
		if i, ok := at[k]; ok {
			ops[i], sizes[i] = op, n
			continue
		}
		at[k] = len(ops)
		ops, sizes = append(ops, op), append(sizes, n)
	}
	if r.Members != nil {
		ms := make([]memberJSON, len(r.Members))
		for i, m := range r.Members {
			ms[i] = memberJSON(m)
		}
		b, _ := json.Marshal(ms)
		k := s.membersKey(domain)
		ops, sizes = append(ops, clientv3.OpPut(k, string(b))), append(sizes, len(k)+len(b))
	}
	if len(r.Persist) > 0 { // a Ready of members only does not move the version
		meta, _ := json.Marshal(metaJSON{Term: r.Term, Version: r.Version})
		mk := s.metaKey(domain)
		ops, sizes = append(ops, clientv3.OpPut(mk, string(meta))), append(sizes, len(mk)+len(meta))
	}

	fence := clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.Term)
	for len(ops) > 0 {
		n, bytes := 0, 0
		for n < len(ops) && n < maxTxnOps && (n == 0 || bytes+sizes[n] <= maxTxnBytes) {
			bytes += sizes[n]
			n++
		}
		resp, err := s.cli.Txn(ctx).If(fence).Then(ops[:n]...).Commit()
		if err != nil {
			return fmt.Errorf("persist %s term %d version %d: %w", domain, r.Term, r.Version, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("%w: persist %s term %d: the election key is gone", ErrNotLeader, domain, r.Term)
		}
		ops, sizes = ops[n:], sizes[n:]
	}
	return nil
}

// Snapshot reads what was persisted for domain, at one etcd revision: the
// records sorted by limit, then key, and the Term and Version of the
// latest Ready that persisted any. A domain with nothing persisted gives
// an empty Snapshot and no error. A new leader passes it to
// coordinator.New, a restarting region to coordinator.NewApplier.
func (s *Store) Snapshot(ctx context.Context, domain string) (coordinator.Snapshot, error) {
	var snap coordinator.Snapshot
	pfx, mk, memk := s.assignKey(domain), s.metaKey(domain), s.membersKey(domain)
	end := clientv3.GetPrefixRangeEnd(pfx)
	var rev int64 // of the first page, at which the others are read; 0: the latest
	for from := pfx; ; {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pageSize), clientv3.WithRev(rev))
		if err != nil {
			return coordinator.Snapshot{}, fmt.Errorf("snapshot of %s: %w", domain, err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) == mk {
				var m metaJSON
				if err := json.Unmarshal(kv.Value, &m); err != nil {
					return coordinator.Snapshot{}, fmt.Errorf("%w: %s: %v", ErrBadRecord, kv.Key, err)
				}
				snap.Term, snap.Version = m.Term, m.Version
				continue
			}
			if string(kv.Key) == memk {
				var ms []memberJSON
				if err := json.Unmarshal(kv.Value, &ms); err != nil {
					return coordinator.Snapshot{}, fmt.Errorf("%w: %s: %v", ErrBadRecord, kv.Key, err)
				}
				snap.Members = make([]coordinator.Member, len(ms))
				for i, m := range ms {
					snap.Members[i] = coordinator.Member(m)
				}
				continue
			}
			var v recordJSON
			if err := json.Unmarshal(kv.Value, &v); err != nil || v.Limit == "" || len(v.Cells) == 0 {
				return coordinator.Snapshot{}, fmt.Errorf("%w: %s: %q", ErrBadRecord, kv.Key, kv.Value)
			}
			rec := coordinator.Record{Limit: v.Limit, Key: v.Key, Cells: make([]coordinator.Cell, len(v.Cells))}
			for i, c := range v.Cells {
				rec.Cells[i] = coordinator.Cell(c)
			}
			snap.Records = append(snap.Records, rec)
		}
		if !resp.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		if rev == 0 {
			rev = resp.Header.Revision
		}
	}
	slices.SortFunc(snap.Records, func(a, b coordinator.Record) int {
		return cmp.Or(cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key))
	})
	return snap, nil
}
