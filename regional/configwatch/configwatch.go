// Package configwatch makes a regional enforcer follow the fleet's
// configuration in etcd: the current version of the limits file, with the
// overrides and plan assignments kept beside it merged in
// (allot.Config.WithDynamic). Every change reaches the engine a watch
// event after it is written, typically within milliseconds.
//
// A bad configuration never reaches the engine: the YAML is parsed and
// validated here again (the Admin API already refused it if it came that
// way), and a version that fails keeps the last good one in force, with
// the error logged and reported by State. An override or plan assignment
// that does not fit is left out and logged; the rest applies. When etcd
// is unreachable the engine keeps the last good configuration, and the
// follower catches up when etcd answers again.
//
//	f := configwatch.New(configwatch.Options{Store: store, Apply: svc.SetConfig, Logger: log})
//	cfg, err := f.Load(ctx) // at start, before serving: etcd's config, if it has one
//	go f.Run(ctx)           // then every change
package configwatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
)

// Options configure a Follower.
type Options struct {
	Store *etcdstore.Store
	// Apply puts a configuration in force (server.Service.SetConfig or
	// regional.Engine.Reconfigure). It is called from Run's goroutine, one
	// call at a time.
	Apply  func(*allot.Config)
	Logger *slog.Logger
	Now    func() time.Time
}

// State is what a Follower has put in force.
type State struct {
	// Version is the configuration version in force (0: none from etcd,
	// or one put without a version).
	Version int64
	// Revision is the etcd revision of the fleet state in force.
	Revision int64
	// At is when it was put in force.
	At time.Time
	// Refused is the latest error that kept a configuration from the
	// engine, until a later one applies cleanly; nil if none.
	Refused error
}

// Follower follows the fleet's configuration in etcd. Its methods are
// safe for concurrent use; Run is called once.
type Follower struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	state State
	base  *allot.Config // the last good parsed file
	yaml  []byte        // base's YAML
	ver   int64         // base's version
}

// New returns a Follower; Run starts it.
func New(opts Options) *Follower {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Follower{opts: opts, log: opts.Logger}
}

// Load reads the fleet's configuration once and returns it merged and
// validated, without applying it: the configuration to start a region
// with. It returns etcdstore.ErrNoConfig when etcd holds none.
func (f *Follower) Load(ctx context.Context) (*allot.Config, error) {
	fl, err := f.opts.Store.Fleet(ctx)
	if err != nil {
		return nil, err
	}
	if fl.YAML == nil {
		return nil, etcdstore.ErrNoConfig
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg, err := f.merge(fl)
	if cfg == nil {
		return nil, err
	}
	f.state = State{Version: f.ver, Revision: fl.Revision, At: f.opts.Now(), Refused: err}
	return cfg, nil
}

// Run applies the fleet's configuration, then every change of it, until
// ctx ends.
func (f *Follower) Run(ctx context.Context) {
	f.opts.Store.WatchFleet(ctx, f.update)
}

// State returns what is in force.
func (f *Follower) State() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

func (f *Follower) update(fl etcdstore.Fleet) {
	if fl.YAML == nil {
		return // nothing in etcd: the configuration in force stays
	}
	f.mu.Lock()
	cfg, err := f.merge(fl)
	ver := f.ver
	f.mu.Unlock()
	if err != nil {
		f.log.Error("configuration from etcd refused in part or whole; the last good one stays in force for the rest",
			"version", fl.Version, "revision", fl.Revision, "err", err)
	}
	if cfg != nil {
		f.opts.Apply(cfg)
		f.log.Debug("configuration from etcd in force", "version", ver, "revision", fl.Revision,
			"overrides", len(fl.Overrides), "assignments", len(fl.Assignments))
	}
	f.mu.Lock()
	if cfg != nil {
		f.state = State{Version: ver, Revision: fl.Revision, At: f.opts.Now(), Refused: err}
	} else {
		f.state.Refused = err
	}
	f.mu.Unlock()
}

// merge parses fl's YAML (unless it is the last good one's) and merges
// fl's overrides and plan assignments into it. A YAML that does not parse
// leaves the last good file in force, with fl's overrides and plan
// assignments; it returns a nil Config only when there is none. The
// caller holds mu.
func (f *Follower) merge(fl etcdstore.Fleet) (*allot.Config, error) {
	var refused error
	if f.base != nil && bytes.Equal(fl.YAML, f.yaml) {
		f.ver = fl.Version // the same file again, maybe under a new version
	} else {
		cfg, err := allot.ParseConfig(fmt.Sprintf("etcd:config@%d", fl.Version), fl.YAML)
		if err != nil {
			refused = fmt.Errorf("configuration version %d (revision %d): %w", fl.Version, fl.ConfigRev, err)
		} else {
			f.base, f.yaml, f.ver = cfg, fl.YAML, fl.Version
		}
	}
	if f.base == nil {
		return nil, refused
	}
	cfg, err := f.base.WithDynamic(fl.Dynamic())
	return cfg, errors.Join(refused, err)
}
