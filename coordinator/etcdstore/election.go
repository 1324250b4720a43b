package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Leadership is this process's leadership of a domain, won by Campaign.
// It is safe for concurrent use.
type Leadership struct {
	// Term is the create revision of the leader's election key: above the
	// term of every earlier leader of the domain, it fences what this
	// leader persists and sends (coordinator.Config.Term).
	Term   int64
	Domain string

	key  string // the election key
	sess *concurrency.Session
	elec *concurrency.Election
	done chan struct{} // closed by watch
	once sync.Once
	rerr error // Resign's result
}

// Key returns the leader's election key.
func (l *Leadership) Key() string { return l.key }

// Done returns a channel that is closed when the leadership is lost: the
// session expired (no keepalive for its TTL) or was closed, the client was
// closed, the election key was deleted, or Resign was called. The leader
// must then stop sending; Persist fails with ErrNotLeader from the moment
// a newer leader may exist.
func (l *Leadership) Done() <-chan struct{} { return l.done }

// Resign gives the leadership up at once (a standby takes over without
// waiting for the session TTL) and closes the session. Done is closed when
// it returns. Calling it again does nothing and returns the first result.
func (l *Leadership) Resign(ctx context.Context) error {
	l.once.Do(func() {
		l.rerr = l.elec.Resign(ctx)
		if err := l.sess.Close(); err != nil {
			l.rerr = errors.Join(l.rerr, fmt.Errorf("revoke session: %w", err))
		}
		<-l.done
	})
	return l.rerr
}

// Campaign blocks until this process leads domain, then returns its
// Leadership; value is what Leader returns to followers and regions (the
// leader's gRPC address). It opens a session whose lease lives for the
// session TTL without keepalives, and campaigns with it in the domain's
// election; if the session is lost while waiting, it campaigns again with
// a new one. ctx bounds only the wait: once elected, the leadership lasts
// until Resign, the loss of the session, or the closing of the client.
// Campaign returns ctx's error when ctx ends first.
func (s *Store) Campaign(ctx context.Context, domain, value string) (*Leadership, error) {
	for {
		l, err := s.campaign(ctx, domain, value)
		if l != nil || err != nil {
			return l, err
		}
		s.log.Warn("etcd session lost while campaigning; campaigning again", "domain", domain)
	}
}

// campaign makes one attempt with one session. It returns nil, nil when
// the session was lost before the leadership was confirmed.
func (s *Store) campaign(ctx context.Context, domain, value string) (*Leadership, error) {
	lease, err := s.cli.Grant(ctx, int64(s.ttl))
	if err != nil {
		return nil, fmt.Errorf("campaign %s: grant lease: %w", domain, err)
	}
	sess, err := concurrency.NewSession(s.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(s.ttl))
	if err != nil { // the lease expires
		return nil, fmt.Errorf("campaign %s: session: %w", domain, err)
	}
	// Stop waiting when ctx ends or the session is lost.
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(sess.Ctx(), cancel)
	elec := concurrency.NewElection(sess, s.electionKey(domain))
	err = elec.Campaign(cctx, value)
	stop()
	cancel()
	if err == nil {
		// Confirm: the session may have expired, and the key with it, while
		// Campaign waited for the older keys to go.
		var resp *clientv3.GetResponse
		if resp, err = s.cli.Get(ctx, elec.Key()); err == nil {
			if len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == elec.Rev() {
				l := &Leadership{Term: elec.Rev(), Domain: domain, key: elec.Key(), sess: sess, elec: elec, done: make(chan struct{})}
				go l.watch(s.cli, resp.Header.Revision+1)
				return l, nil
			}
			err = concurrency.ErrElectionNotLeader
		}
	}
	lost := sess.Ctx().Err() != nil
	sess.Close() //nolint:errcheck // the lease expires anyway
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case lost || errors.Is(err, concurrency.ErrElectionNotLeader):
		return nil, nil
	}
	return nil, fmt.Errorf("campaign %s: %w", domain, err)
}

// watch closes l.done when the session ends or the election key is
// deleted, watching from revision rev.
func (l *Leadership) watch(cli *clientv3.Client, rev int64) {
	defer close(l.done)
	ctx := l.sess.Ctx()
	for {
		for wr := range cli.Watch(ctx, l.key, clientv3.WithRev(rev)) {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return
				}
			}
			rev = wr.Header.Revision + 1
		}
		if ctx.Err() != nil {
			return
		}
		// The watch broke (compaction, …): check the key is still ours.
		resp, err := cli.Get(ctx, l.key)
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.Term {
			return
		}
		rev = resp.Header.Revision + 1
	}
}

// Leader returns the value of domain's current leader, or ErrNoLeader.
func (s *Store) Leader(ctx context.Context, domain string) (string, error) {
	resp, err := s.cli.Get(ctx, s.electionKey(domain)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("leader of %s: %w", domain, err)
	}
	if len(resp.Kvs) == 0 {
		return "", ErrNoLeader
	}
	return string(resp.Kvs[0].Value), nil
}
