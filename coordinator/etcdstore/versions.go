package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors of the versioned configuration.
var (
	// ErrConflict is returned by ApplyConfig when the current version is
	// not the one the change was based on: someone applied in between.
	ErrConflict = errors.New("etcdstore: the configuration changed concurrently")
	// ErrNoVersion is returned by Version for a version that was never
	// stored.
	ErrNoVersion = errors.New("etcdstore: no such version")
)

// ConfigVersion is one applied limits configuration. Versions are numbered
// from 1 without gaps; every one is kept.
type ConfigVersion struct {
	Version int64     `json:"version"`
	Time    time.Time `json:"time"`
	Author  string    `json:"author,omitempty"`
	Summary string    `json:"summary,omitempty"`
	// RollbackOf is the version whose YAML this one restored.
	RollbackOf int64  `json:"rollback_of,omitempty"`
	YAML       string `json:"yaml"`
}

func (s *Store) versionsKey() string { return s.prefix + "config/versions/" }
func (s *Store) versionKey(n int64) string {
	return fmt.Sprintf("%s%020d", s.versionsKey(), n)
}

// versionOf parses the number of a version key.
func (s *Store) versionOf(key []byte) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimPrefix(string(key), s.versionsKey()), 10, 64)
	return n, err == nil && n > 0
}

// ApplyConfig stores v as version base+1 and puts its YAML as the fleet's
// config (what WatchConfig and WatchFleet report), in one transaction
// that succeeds only while base is the current version (0: no version
// yet); otherwise it returns ErrConflict. It does not validate v.YAML:
// the caller does. It returns v with its Version set.
func (s *Store) ApplyConfig(ctx context.Context, base int64, v ConfigVersion) (ConfigVersion, error) {
	v.Version = base + 1
	b, err := json.Marshal(v)
	if err != nil {
		return ConfigVersion{}, fmt.Errorf("apply config: %w", err)
	}
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.versionKey(v.Version)), "=", 0)}
	if base > 0 {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.versionKey(base)), ">", 0))
	}
	resp, err := s.cli.Txn(ctx).If(conds...).Then(
		clientv3.OpPut(s.versionKey(v.Version), string(b)),
		clientv3.OpPut(s.configKey(), v.YAML),
	).Commit()
	switch {
	case err != nil:
		return ConfigVersion{}, fmt.Errorf("apply config version %d: %w", v.Version, err)
	case !resp.Succeeded:
		return ConfigVersion{}, fmt.Errorf("%w: version %d is not the current one", ErrConflict, base)
	}
	return v, nil
}

// Version returns version n, or the current one when n is 0. It returns
// ErrNoConfig when no version was ever stored and ErrNoVersion for an n
// that was not.
func (s *Store) Version(ctx context.Context, n int64) (ConfigVersion, error) {
	var resp *clientv3.GetResponse
	var err error
	if n == 0 {
		resp, err = s.cli.Get(ctx, s.versionsKey(), clientv3.WithLastKey()...)
	} else {
		resp, err = s.cli.Get(ctx, s.versionKey(n))
	}
	switch {
	case err != nil:
		return ConfigVersion{}, fmt.Errorf("read config version %d: %w", n, err)
	case len(resp.Kvs) == 0 && n == 0:
		return ConfigVersion{}, ErrNoConfig
	case len(resp.Kvs) == 0:
		return ConfigVersion{}, fmt.Errorf("%w: %d", ErrNoVersion, n)
	}
	return decodeVersion(resp.Kvs[0].Key, resp.Kvs[0].Value)
}

// History returns the latest n versions (all if n ≤ 0), newest first.
func (s *Store) History(ctx context.Context, n int) ([]ConfigVersion, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)}
	if n > 0 {
		opts = append(opts, clientv3.WithLimit(int64(n)))
	}
	resp, err := s.cli.Get(ctx, s.versionsKey(), opts...)
	if err != nil {
		return nil, fmt.Errorf("read config history: %w", err)
	}
	out := make([]ConfigVersion, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v, err := decodeVersion(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func decodeVersion(key, value []byte) (ConfigVersion, error) {
	var v ConfigVersion
	if err := json.Unmarshal(value, &v); err != nil || v.Version <= 0 {
		return ConfigVersion{}, fmt.Errorf("%w: %s: %q", ErrBadRecord, key, value)
	}
	return v, nil
}
