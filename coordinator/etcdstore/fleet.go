package etcdstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot"
)

// Fleet is what the regions enforce, as stored in etcd at one revision:
// the limits YAML and the overrides and plan assignments kept beside it.
type Fleet struct {
	Revision  int64  // the etcd revision it was read at
	YAML      []byte // nil: no configuration stored
	ConfigRev int64  // mod revision of YAML
	// Version is the version ApplyConfig stored YAML as; 0 when it was
	// put otherwise (PutConfig, etcdctl).
	Version     int64
	Overrides   []Override
	Assignments []PlanAssignment
}

// Dynamic returns f's overrides and plan assignments by domain, for
// allot.Config.WithDynamic.
func (f Fleet) Dynamic() allot.Dynamic {
	dyn := allot.Dynamic{Overrides: map[string][]allot.Override{}, Assignments: map[string][]allot.PlanAssignment{}}
	for _, o := range f.Overrides {
		dyn.Overrides[o.Domain] = append(dyn.Overrides[o.Domain], o.Override)
	}
	for _, a := range f.Assignments {
		dyn.Assignments[a.Domain] = append(dyn.Assignments[a.Domain], a.PlanAssignment)
	}
	return dyn
}

// fleetState is a Fleet being kept up to date from watch events.
type fleetState struct {
	yaml                []byte
	configRev           int64
	lastVer, lastVerRev int64 // the latest version key, and its mod revision
	overrides           map[string]Override
	assignments         map[string]PlanAssignment
}

func (st *fleetState) fleet(rev int64) Fleet {
	f := Fleet{Revision: rev, YAML: st.yaml, ConfigRev: st.configRev}
	if st.lastVerRev == st.configRev && st.configRev != 0 { // written in one transaction
		f.Version = st.lastVer
	}
	for _, k := range slices.Sorted(maps.Keys(st.overrides)) {
		f.Overrides = append(f.Overrides, st.overrides[k])
	}
	for _, k := range slices.Sorted(maps.Keys(st.assignments)) {
		f.Assignments = append(f.Assignments, st.assignments[k])
	}
	return f
}

// apply applies one key's change.
func (s *Store) apply(st *fleetState, put bool, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	switch {
	case key == s.configKey():
		if put {
			st.yaml, st.configRev = kv.Value, kv.ModRevision
		}
	case strings.HasPrefix(key, s.versionsKey()):
		if n, ok := s.versionOf(kv.Key); ok && put && n >= st.lastVer {
			st.lastVer, st.lastVerRev = n, kv.ModRevision
		}
	case strings.HasPrefix(key, s.overridesKey("")):
		delete(st.overrides, key)
		if put {
			if o, ok := s.decodeOverride(kv.Key, kv.Value); ok {
				st.overrides[key] = o
			}
		}
	case strings.HasPrefix(key, s.plansKey("")):
		delete(st.assignments, key)
		if put {
			if a, ok := s.decodeAssignment(kv.Key, kv.Value); ok {
				st.assignments[key] = a
			}
		}
	}
}

// read reads the whole state at one revision.
func (s *Store) read(ctx context.Context) (*fleetState, int64, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.configKey()),
		clientv3.OpGet(s.versionsKey(), append(clientv3.WithLastKey(), clientv3.WithKeysOnly())...),
		clientv3.OpGet(s.overridesKey(""), clientv3.WithPrefix()),
		clientv3.OpGet(s.plansKey(""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read the fleet's config: %w", err)
	}
	st := &fleetState{overrides: map[string]Override{}, assignments: map[string]PlanAssignment{}}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			s.apply(st, true, kv)
		}
	}
	return st, resp.Header.Revision, nil
}

// Fleet reads the fleet's configuration, overrides and plan assignments
// at one revision.
func (s *Store) Fleet(ctx context.Context) (Fleet, error) {
	st, rev, err := s.read(ctx)
	if err != nil {
		return Fleet{}, err
	}
	return st.fleet(rev), nil
}

// WatchFleet calls fn with the fleet as it is, then again after every
// change of its configuration, overrides (an expiry deletes one) or plan
// assignments, until ctx ends or the client is closed. fn runs on the
// caller's goroutine, one call at a time; each call has the whole state
// at a revision at least the previous call's. After an error (etcd
// unreachable, a compaction) it reads the whole state again, with a
// backoff of up to 5 s, logging the error; the last state stays valid
// meanwhile.
func (s *Store) WatchFleet(ctx context.Context, fn func(Fleet)) {
	const minWait, maxWait = 100 * time.Millisecond, 5 * time.Second
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
		st, rev, err := s.read(ctx)
		if err != nil {
			if ctx.Err() != nil || s.cli.Ctx().Err() != nil {
				return
			}
			s.log.Warn("read the fleet's config", "err", err)
			continue
		}
		fn(st.fleet(rev))
		wctx, cancel := context.WithCancel(ctx)
		for wr := range s.cli.Watch(clientv3.WithRequireLeader(wctx), s.prefix+"config/", clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if err := wr.Err(); err != nil {
				s.log.Warn("watch the fleet's config", "err", err)
				break
			}
			for _, ev := range wr.Events {
				s.apply(st, ev.Type == mvccpb.PUT, ev.Kv)
			}
			if len(wr.Events) > 0 {
				fn(st.fleet(wr.Header.Revision))
			}
			wait = 0 // it works again
		}
		cancel()
		if ctx.Err() != nil || s.cli.Ctx().Err() != nil {
			return
		}
	}
}
