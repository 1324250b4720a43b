package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Region is one regional enforcer as it registers itself, so that
// operators' tools and the coordinator can reach its read-only Admin API.
type Region struct {
	Region string `json:"region"`
	Addr   string `json:"addr"` // gRPC address (allot.v1.Admin)
	HTTP   string `json:"http,omitempty"`
}

func (s *Store) regionsKey() string { return s.prefix + "regions/" }

// Registration keeps a Region registered until Close.
type Registration struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Register registers r under a lease of the session TTL that it keeps
// alive, so that the registration disappears within that TTL after the
// process dies. If the lease is lost (etcd unreachable for longer), it
// registers again once etcd answers. It returns once r is registered, or
// ctx's error if ctx ends first.
func (s *Store) Register(ctx context.Context, r Region) (*Registration, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", r.Region, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	sess, err := s.register(rctx, r, b)
	stop()
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, err
	}
	g := &Registration{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		for {
			select {
			case <-rctx.Done(): // the session's keepalive stops with rctx: revoke here
				cctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.ttl)*time.Second)
				s.cli.Revoke(cctx, sess.Lease()) //nolint:errcheck // deregisters now rather than at the lease's expiry
				cancel()
				return
			case <-sess.Done():
			}
			s.log.Warn("region registration lost; registering again", "region", r.Region)
			for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
				if sess, err = s.register(rctx, r, b); err == nil {
					break
				}
				if rctx.Err() != nil {
					return
				}
				s.log.Warn("register region", "region", r.Region, "err", err)
				t := time.NewTimer(wait)
				select {
				case <-rctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
		}
	}()
	return g, nil
}

func (s *Store) register(ctx context.Context, r Region, value []byte) (*concurrency.Session, error) {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(s.ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("register %s: session: %w", r.Region, err)
	}
	key := fmt.Sprintf("%s%s/%x", s.regionsKey(), url.PathEscape(r.Region), int64(sess.Lease()))
	if _, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(sess.Lease())); err != nil {
		sess.Close() //nolint:errcheck // the lease expires anyway
		return nil, fmt.Errorf("register %s: %w", r.Region, err)
	}
	return sess, nil
}

// Close deregisters the region and stops keeping it registered.
func (g *Registration) Close() {
	g.cancel()
	<-g.done
}

// Regions returns the registered regional enforcers, by region and
// address.
func (s *Store) Regions(ctx context.Context) ([]Region, error) {
	resp, err := s.cli.Get(ctx, s.regionsKey(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read regions: %w", err)
	}
	var out []Region
	for _, kv := range resp.Kvs {
		var r Region
		if err := json.Unmarshal(kv.Value, &r); err != nil || r.Region == "" || r.Addr == "" {
			s.log.Warn("malformed region registration in etcd, skipped", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Region) int {
		if c := strings.Compare(a.Region, b.Region); c != 0 {
			return c
		}
		return strings.Compare(a.Addr, b.Addr)
	})
	return out, nil
}
