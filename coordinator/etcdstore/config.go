package etcdstore

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PutConfig stores the fleet's limits YAML, replacing the previous one.
// It does not validate yaml: the caller does, before putting it.
func (s *Store) PutConfig(ctx context.Context, yaml []byte) error {
	if _, err := s.cli.Put(ctx, s.configKey(), string(yaml)); err != nil {
		return fmt.Errorf("put config: %w", err)
	}
	return nil
}

// Config returns the fleet's limits YAML and its mod revision (which
// increases with every PutConfig), or ErrNoConfig.
func (s *Store) Config(ctx context.Context) ([]byte, int64, error) {
	resp, err := s.cli.Get(ctx, s.configKey())
	if err != nil {
		return nil, 0, fmt.Errorf("get config: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, ErrNoConfig
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// WatchConfig calls fn with the current config (if there is one), then
// with every config put, in order of increasing revision, until ctx ends
// or the client is closed; it returns then. fn runs on the caller's goroutine, one call at a time;
// a slow fn delays the next calls, never skips a revision that etcd still
// has (after a compaction, it resumes from the current config). A deleted
// config is not reported: the fleet keeps the last one. After an error
// (etcd unreachable, watch cancelled) it resumes with a backoff of up to
// 5 s, logging the error.
func (s *Store) WatchConfig(ctx context.Context, fn func(yaml []byte, rev int64)) {
	const minWait, maxWait = 100 * time.Millisecond, 5 * time.Second
	key := s.configKey()
	var last, next int64 // the revision of the last config passed to fn; where to watch from (0: read first)
	for wait := time.Duration(0); ; wait = min(max(2*wait, minWait), maxWait) {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if next == 0 {
			resp, err := s.cli.Get(ctx, key)
			if err != nil {
				if ctx.Err() != nil || s.cli.Ctx().Err() != nil {
					return
				}
				s.log.Warn("read config", "err", err)
				continue
			}
			if len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision > last {
				last = resp.Kvs[0].ModRevision
				fn(resp.Kvs[0].Value, last)
			}
			next = resp.Header.Revision + 1
		}
		wctx, cancel := context.WithCancel(ctx)
		for wr := range s.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(next)) {
			if err := wr.Err(); err != nil {
				s.log.Warn("watch config", "err", err)
				if wr.CompactRevision != 0 {
					next = 0 // what we missed is gone: read the current config
				}
				break
			}
			for _, ev := range wr.Events {
				next = ev.Kv.ModRevision + 1
				if ev.Type == mvccpb.PUT {
					last = ev.Kv.ModRevision
					fn(ev.Kv.Value, last)
				}
			}
			wait = 0 // it works again
		}
		cancel()
		if ctx.Err() != nil || s.cli.Ctx().Err() != nil {
			return
		}
	}
}
