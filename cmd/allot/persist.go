package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
	"github.com/allot-dev/allot/regional/redisstore"
)

// restoreTimeout bounds the restore at start: past it, the windows start
// with nothing, as without persistence.
const restoreTimeout = 5 * time.Second

// persistMarks is the MarkStore an instance persists its long windows'
// counts in (a connection of its own to --redis, without metrics: the
// enforcer's store exports them), and its close. There is none without
// --redis, without a stable instance id (the certificate's, or
// --instance; a made-up id is new at every start, so it has nothing to
// restore) or with --persist-interval 0.
func persistMarks(spec regionSpec, instance string, log *slog.Logger) (regional.MarkStore, func(), error) {
	switch {
	case spec.persistEvery <= 0 || len(spec.redis) == 0:
		return nil, func() {}, nil
	case instance == "":
		log.Info("no stable instance id (a TLS certificate's, or --instance): long windows are not persisted, a restarted instance starts them with nothing")
		return nil, func() {}, nil
	}
	rs, err := redisstore.New(redisstore.Options{Addrs: spec.redis, Cluster: spec.redisCluster,
		TLS: spec.sec.redis, TLSFor: spec.sec.redisFor, Username: spec.sec.redisUser, Password: spec.sec.redisPassword,
		Prefix: redisstore.DefaultPrefix + spec.name + ":", Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return rs, func() { rs.Close() }, nil
}

// restorePersisted restores what an earlier process of the instance
// persisted; a store that does not answer leaves the windows to start
// with nothing (safe: the instance then admits nothing of them until the
// next window).
func restorePersisted(ctx context.Context, n *node.Node, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	k, err := n.Restore(rctx, n.Now(time.Now())) // engine time: the coordinator's, as measured (none yet at start)
	switch {
	case err != nil:
		log.Warn("long windows not (all) restored: those not restored start with nothing", "instance", n.Instance(), "restored", k, "err", err)
	case k > 0:
		log.Info("long windows restored", "instance", n.Instance(), "limits", k)
	}
}

// runPersist persists the instance's long windows every interval until
// the returned function is first called, which persists once more and
// returns (later calls do nothing).
func runPersist(n *node.Node, every time.Duration, log *slog.Logger) func() {
	if every <= 0 {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	persist := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), max(every, time.Second))
		defer cancel()
		_, err := n.Persist(ctx, n.Now(time.Now())) // engine time
		return err
	}
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			err := persist()
			switch {
			case err != nil && !failing:
				log.Warn("long windows not persisted: their keys are held at what is persisted until it answers", "err", err)
			case err == nil && failing:
				log.Info("long windows persisted again")
			}
			failing = err != nil
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			<-done
			persist()
		})
	}
}
