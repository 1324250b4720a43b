package etcdstore

import (
	"errors"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors returned by a Store.
var (
	// ErrNotLeader is returned by Persist when the leadership's election
	// key is gone or was replaced: a newer leader may exist, so nothing
	// more may be written or sent under this term.
	ErrNotLeader = errors.New("etcdstore: not the leader")
	// ErrNoLeader is returned by Leader when no process leads the domain.
	ErrNoLeader = errors.New("etcdstore: no leader")
	// ErrNoConfig is returned by Config when no configuration was put.
	ErrNoConfig = errors.New("etcdstore: no config")
	// ErrBadRecord is returned by Snapshot for a persisted value it cannot
	// decode, and by Persist for a record it cannot encode (NaN shares).
	ErrBadRecord = errors.New("etcdstore: malformed record")
)

// DefaultPrefix is the prefix of every key when New is given "".
const DefaultPrefix = "/allot/"

// DefaultSessionTTL is how long a leader's session outlives its last
// keepalive: the longest a standby waits after the leader dies.
const DefaultSessionTTL = 5 * time.Second

// Store keeps allot's coordination state in etcd under a prefix. It is
// safe for concurrent use. The zero value is not usable; call New.
type Store struct {
	cli    *clientv3.Client
	prefix string
	ttl    int // session TTL, whole seconds
	log    *slog.Logger
}

// Option configures a Store.
type Option func(*Store)

// WithSessionTTL sets the TTL of the sessions Campaign opens (rounded up
// to whole seconds; etcd may raise it to its minimum lease TTL).
func WithSessionTTL(d time.Duration) Option {
	return func(s *Store) { s.ttl = max(1, int(math.Ceil(d.Seconds()))) }
}

// WithLogger sets where WatchConfig and Campaign log the errors they
// recover from (a discard handler by default).
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) { s.log = l }
}

// New returns a Store that keeps its keys in etcd under prefix
// (DefaultPrefix if empty; a '/' is appended if missing). The Store does
// not own cli: the caller closes it, after which every method fails.
func New(cli *clientv3.Client, prefix string, opts ...Option) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	s := &Store{cli: cli, prefix: prefix, ttl: int(DefaultSessionTTL / time.Second), log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (s *Store) domainKey(domain string) string {
	return s.prefix + "domains/" + url.PathEscape(domain) + "/"
}
func (s *Store) electionKey(domain string) string { return s.domainKey(domain) + "election" }
func (s *Store) assignKey(domain string) string   { return s.domainKey(domain) + "assignments/" }
func (s *Store) metaKey(domain string) string     { return s.assignKey(domain) + "meta" }
func (s *Store) membersKey(domain string) string  { return s.assignKey(domain) + "members" }
func (s *Store) recordKey(domain, limit, key string) string {
	return s.assignKey(domain) + "records/" + url.PathEscape(limit) + "/" + url.PathEscape(key)
}
func (s *Store) configKey() string { return s.prefix + "config/limits" }
