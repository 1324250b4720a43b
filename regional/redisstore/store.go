package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/allot-dev/allot/regional"
)

// Defaults of Options.
const (
	DefaultPrefix      = "allot:"
	DefaultMaxInFlight = 10_000
	DefaultCooldown    = time.Second
	// DefaultLateMargin is taken off a call's deadline before the scripts
	// compare it with Redis time: a reply that leaves Redis before the
	// deadline less the margin should reach the caller before it gives up
	// (a round trip within a region, and a busy client's scheduling).
	DefaultLateMargin = time.Millisecond
)

// giveBackTimeout bounds giving back a partial charge in a Cluster, which
// runs after the request's deadline may have passed.
const giveBackTimeout = 100 * time.Millisecond

// ErrBadReply is returned when Redis answers a script with something it
// does not return: a store that is not this package's.
var ErrBadReply = errors.New("redisstore: unexpected reply")

// ErrLate is returned by a call that reached Redis after its deadline
// (less Options.LateMargin, on Redis time): its script changed nothing.
// It is a context.DeadlineExceeded, so the caller's on_failure applies
// as for a timeout; the caller has usually left at its deadline already.
var ErrLate = fmt.Errorf("redisstore: the call reached Redis after its deadline and changed nothing: %w", context.DeadlineExceeded)

var (
	//go:embed lua/late.lua
	lateLua string
	//go:embed lua/bucket.lua
	bucketLua string
	//go:embed lua/take.lua
	takeLua string
	//go:embed lua/lease.lua
	leaseLua string
	//go:embed lua/members.lua
	membersLua string
)

// script is a Lua script and its SHA-1, for EVALSHA.
type script struct {
	src, sha string
	// deadline: the script charges, and is sent its caller's deadline
	// first (lua/late.lua), so that it changes nothing once it has passed.
	deadline bool
}

func newScript(src string) script { return script{src: src, sha: redis.NewScript(src).Hash()} }

// newCharging returns a script that charges: it starts with lua/late.lua.
func newCharging(src string) script {
	sc := newScript(lateLua + src)
	sc.deadline = true
	return sc
}

var (
	takeScript    = newCharging(bucketLua + takeLua)
	leaseScript   = newCharging(bucketLua + leaseLua)
	membersScript = newScript(membersLua)
)

// Options configure a Store.
type Options struct {
	// Addrs are the Redis server's address, or seed nodes of a Cluster.
	Addrs []string
	// Cluster makes Addrs a Redis Cluster's seed nodes.
	Cluster bool
	// TLS, when set, makes every connection TLS with it (a Redis started
	// with --tls-port; with a client certificate for --tls-auth-clients);
	// nil means plain text.
	TLS *tls.Config
	// TLSFor, when set, gives each new connection its TLS configuration at
	// dial time, for the host it dials, instead of TLS: the CA bundle and
	// certificate in force then (a rotated CA reaches a long-lived
	// store). It takes precedence over TLS.
	TLSFor func(host string) *tls.Config
	// Username and Password authenticate every connection (AUTH): an ACL
	// user, or only Password for requirepass. Empty: no AUTH.
	Username, Password string
	// Prefix starts every key; one Redis may serve several regions or
	// deployments under different prefixes. "" means DefaultPrefix.
	Prefix string
	// MaxInFlight bounds the script calls queued or running; past it, a
	// call fails at once. 0 means DefaultMaxInFlight.
	MaxInFlight int
	// Cooldown is how long the breaker stays open before it lets a few
	// calls probe Redis again. 0 means DefaultCooldown.
	Cooldown time.Duration
	// LateMargin is taken off a call's deadline before the scripts that
	// charge compare it with Redis time (TIME): past it they change
	// nothing and the call fails with ErrLate. 0 means DefaultLateMargin;
	// it must be shorter than the calls' timeouts.
	LateMargin time.Duration
	// Registry receives the store's metrics; nil exports none.
	Registry prometheus.Registerer
	// Logger receives breaker transitions; nil discards.
	Logger *slog.Logger
}

// tlsDialer dials TCP, then TLS with the configuration cfg gives for the
// host at this dial.
func tlsDialer(cfg func(host string) *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg(host)
		if c.ServerName == "" {
			c = c.Clone()
			c.ServerName = host
		}
		conn := tls.Client(raw, c)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// Store keeps the buckets of leased and exact limits, and the region's
// membership, in a regional Redis: a single server or a Redis Cluster.
// Scripts take time from Redis (TIME); concurrent calls are pipelined
// (go-redis autopipelining), bounded by MaxInFlight, and go through one
// circuit breaker: when half of at least 20 calls in the last second
// failed, every call fails at once for Cooldown,
// then a few calls probe Redis and close the breaker if they succeed.
//
// A Store is safe for concurrent use. The zero value is not usable; call
// New, and Close when done.
type Store struct {
	client  redis.UniversalClient
	ap      *redis.AutoPipeliner
	cluster bool
	prefix  string
	margin  time.Duration // Options.LateMargin
	breaker *gobreaker.CircuitBreaker[struct{}]
	log     *slog.Logger
	metrics *metrics
}

var _ regional.Store = (*Store)(nil)

// New connects to Redis; it does not wait for Redis to answer, so a store
// that is down at start is a store that fails (and recovers) later.
func New(opts Options) (*Store, error) {
	if len(opts.Addrs) == 0 {
		return nil, errors.New("redisstore: no address")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = DefaultCooldown
	}
	if opts.LateMargin < 0 {
		return nil, fmt.Errorf("redisstore: LateMargin %v: want 0 (the default, %v) or more", opts.LateMargin, DefaultLateMargin)
	}
	if opts.LateMargin == 0 {
		opts.LateMargin = DefaultLateMargin
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(opts.Addrs) > 1 && !opts.Cluster {
		return nil, errors.New("redisstore: several addresses are a Cluster's seeds: set Cluster")
	}
	// A call's deadline is its socket deadline, and nothing retries: a
	// retry would miss the deadline anyway, and the breaker decides.
	var dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	if opts.TLSFor != nil {
		opts.TLS, dialer = nil, tlsDialer(opts.TLSFor)
	}
	var client redis.UniversalClient
	if opts.Cluster {
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: opts.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1,
			TLSConfig: opts.TLS, Dialer: dialer, Username: opts.Username, Password: opts.Password,
			DialTimeout: time.Second, DialerRetries: 1, ReadTimeout: time.Second, WriteTimeout: time.Second,
			// Slots move when a replica takes over a dead primary; a
			// connection error does not say so, a reload does.
			ClusterStateReloadInterval: time.Second,
		})
	} else {
		client = redis.NewClient(&redis.Options{
			Addr: opts.Addrs[0], ContextTimeoutEnabled: true, MaxRetries: -1,
			TLSConfig: opts.TLS, Dialer: dialer, Username: opts.Username, Password: opts.Password,
			DialTimeout: time.Second, DialerRetries: 1, ReadTimeout: time.Second, WriteTimeout: time.Second,
		})
	}
	ap, err := client.AsyncAutoPipelineWithOptions(&redis.AutoPipelineOptions{
		MaxBatchSize:      200,
		MaxQueuedCommands: opts.MaxInFlight,
	})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	s := &Store{client: client, ap: ap, cluster: opts.Cluster, prefix: opts.Prefix, margin: opts.LateMargin, log: opts.Logger}
	s.breaker = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         "redis",
		MaxRequests:  3,
		Interval:     time.Second, // a rolling second, in tenths
		BucketPeriod: 100 * time.Millisecond,
		Timeout:      opts.Cooldown,
		// A ratio, not failures in a row: calls in flight together time
		// out together on a short stall (a pause, a busy CPU), which must
		// not open the breaker for a whole cooldown.
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.Requests >= 20 && 2*c.TotalFailures >= c.Requests },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			s.log.Warn("regional store breaker", "from", from.String(), "to", to.String())
		},
	})
	s.metrics = newMetrics(s, opts.Registry)
	return s, nil
}

// Close closes the connections to Redis.
func (s *Store) Close() error {
	return errors.Join(s.ap.Close(), s.client.Close())
}

// Ping loads the scripts into Redis (every primary of a Cluster), which
// also opens connections and learns a Cluster's slots: call it at start,
// so that the first checks do not pay for it. It does not go through the
// breaker.
func (s *Store) Ping(ctx context.Context) error {
	for _, sc := range []*script{&takeScript, &leaseScript, &membersScript} {
		if err := s.client.ScriptLoad(ctx, sc.src).Err(); err != nil {
			return fmt.Errorf("redisstore: %w", err)
		}
	}
	return nil
}

// Breaker returns the breaker's state.
func (s *Store) Breaker() gobreaker.State { return s.breaker.State() }

// key is a bucket's Redis key: the hash tag keeps the key's fields in one
// slot of a Cluster, whatever the prefix.
func (s *Store) key(name string) string { return s.prefix + "{" + name + "}" }

// call is one script call in a batch.
type call struct {
	script *script
	keys   []string
	args   []any
	reply  []any
	err    error
}

// do runs the calls, pipelined with every other caller's, within ctx and
// through the breaker. It fails if any call fails; each call has its own
// reply or error.
func (s *Store) do(ctx context.Context, op string, calls []call) error {
	start := time.Now()
	_, err := s.breaker.Execute(func() (struct{}, error) { return struct{}{}, s.send(ctx, calls) })
	s.metrics.observe(op, err, time.Since(start), len(calls))
	for i := range calls {
		if c := &calls[i]; c.err == nil && c.reply == nil {
			c.err = err // not sent: the breaker is open
		}
	}
	return err
}

func (s *Store) send(ctx context.Context, calls []call) error {
	deadline := s.deadline(ctx)
	args := make([][]any, len(calls))
	cmds := make([]*redis.Cmd, len(calls))
	futures := make([]redis.AutoFuture, len(calls))
	for i := range calls {
		args[i] = calls[i].args
		if calls[i].script.deadline {
			args[i] = append([]any{deadline}, calls[i].args...)
		}
		cmds[i] = redis.NewCmd(ctx, evalArgs("evalsha", calls[i].script.sha, calls[i].keys, args[i])...)
		futures[i] = s.ap.Submit(ctx, cmds[i])
	}
	var first error
	for i := range calls {
		c := &calls[i]
		c.err = futures[i].WaitContext(ctx)
		if redis.HasErrorPrefix(c.err, "NOSCRIPT") { // a restarted or new server: send the source once
			cmds[i] = redis.NewCmd(ctx, evalArgs("eval", c.script.src, c.keys, args[i])...)
			c.err = s.ap.Submit(ctx, cmds[i]).WaitContext(ctx)
		}
		if redis.HasErrorPrefix(c.err, "LATE") {
			c.err = ErrLate
		}
		if c.err == nil {
			if c.reply, c.err = cmds[i].Slice(); c.err == nil && len(c.reply) == 0 {
				c.err = ErrBadReply
			}
		}
		if first == nil {
			first = c.err
		}
	}
	return first
}

// deadline is what a charging script is sent of ctx's deadline: unix µs
// less the margin, 0 for none (a call without a deadline runs whenever it
// arrives).
func (s *Store) deadline(ctx context.Context) int64 {
	d, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(d.Add(-s.margin).UnixMicro(), 1)
}

func evalArgs(cmd, script string, keys []string, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, cmd, script, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, args...)
}

func bucketArgs(b *regional.Bucket, a []any) []any {
	return append(a, int(b.Algorithm), b.Amount, b.Burst, b.Period.Microseconds())
}

// ints reads n integers from a script's reply, from offset off.
func ints(reply []any, off, n int) ([]int64, error) {
	if len(reply) < off+n {
		return nil, ErrBadReply
	}
	out := make([]int64, n)
	for i := range out {
		v, ok := reply[off+i].(int64)
		if !ok {
			return nil, fmt.Errorf("%w: %T", ErrBadReply, reply[off+i])
		}
		out[i] = v
	}
	return out, nil
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// Take implements regional.Store. On a single server it is one script
// over every key, so a request is charged on all its keys or none. A
// Cluster cannot run one script over keys of several slots: there each
// key is charged on its own, in one pipeline, and when one rejects, the
// others' charges are given back. Between the two, concurrent requests
// may see up to this request's cost missing from those keys (they may
// reject more, never admit more); a give-back that fails loses the cost
// until the bucket refills.
func (s *Store) Take(ctx context.Context, _ time.Time, ops []regional.TakeOp, res []regional.TakeResult) error {
	groups := [][]int{make([]int, len(ops))}
	for i := range ops {
		groups[0][i] = i
	}
	if s.cluster {
		groups = byKey(ops)
	}
	calls := make([]call, len(groups))
	for g, idx := range groups {
		c := &calls[g]
		c.script = &takeScript
		for _, i := range idx {
			op := &ops[i]
			c.keys = append(c.keys, s.key(op.Key))
			shadow := 0
			if op.Shadow {
				shadow = 1
			}
			c.args = append(bucketArgs(&op.Bucket, c.args), op.Cost, shadow)
		}
	}
	err := s.do(ctx, "take", calls)
	admit, windows := true, make([]int64, len(ops))
	for g, idx := range groups {
		if calls[g].err != nil {
			continue
		}
		v, perr := ints(calls[g].reply, 0, 5*len(idx))
		if perr != nil {
			calls[g].err, err = perr, cmp.Or(err, perr)
			continue
		}
		for j, i := range idx {
			r := v[5*j:]
			res[i] = regional.TakeResult{Allowed: r[0] == 1, Remaining: float64(r[1]), ResetAfter: us(r[2]), RetryAfter: us(r[3])}
			windows[i] = r[4] * 1000
			admit = admit && (res[i].Allowed || ops[i].Shadow)
		}
	}
	if len(groups) > 1 && (err != nil || !admit) {
		s.giveBack(ctx, ops, groups, calls, res, windows)
	}
	return err
}

// byKey groups the indexes of ops by key, in order.
func byKey(ops []regional.TakeOp) [][]int {
	var groups [][]int
	seen := make(map[string]int, len(ops))
	for i := range ops {
		g, ok := seen[ops[i].Key]
		if !ok {
			g = len(groups)
			seen[ops[i].Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// giveBack returns the charges of the keys that admitted a request that
// another key rejected (or whose call failed).
func (s *Store) giveBack(ctx context.Context, ops []regional.TakeOp, groups [][]int, calls []call, res []regional.TakeResult, windows []int64) {
	var back []regional.LeaseOp
	for g, idx := range groups {
		if calls[g].err != nil {
			continue
		}
		charged := true // the script charged its key only if each of its ops admitted
		for _, i := range idx {
			charged = charged && (res[i].Allowed || ops[i].Shadow)
		}
		for _, i := range idx {
			if charged && res[i].Allowed && ops[i].Cost > 0 {
				back = append(back, regional.LeaseOp{Bucket: ops[i].Bucket, Return: ops[i].Cost, Window: windows[i]})
			}
		}
	}
	if len(back) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	if err := s.Lease(ctx, time.Time{}, back, make([]regional.LeaseResult, len(back))); err != nil {
		s.log.Warn("regional store: giving back a partial charge failed; the cost is lost until the buckets refill", "err", err)
	}
}

// Lease implements regional.Store: one script call per op, pipelined.
func (s *Store) Lease(ctx context.Context, _ time.Time, ops []regional.LeaseOp, res []regional.LeaseResult) error {
	calls := make([]call, len(ops))
	for i := range ops {
		op := &ops[i]
		calls[i] = call{script: &leaseScript, keys: []string{s.key(op.Key)},
			args: append(bucketArgs(&op.Bucket, make([]any, 0, 9)), op.Return, op.Window/1000, op.Min, op.Want, op.Ahead.Microseconds())}
	}
	if err := s.do(ctx, "lease", calls); err != nil {
		return err
	}
	for i := range calls {
		v, err := ints(calls[i].reply, 0, 5)
		if err != nil {
			return err
		}
		res[i] = regional.LeaseResult{Granted: float64(v[0]), Available: float64(v[1]), RetryAfter: us(v[2]), Window: v[3] * 1000, WindowLeft: us(v[4])}
	}
	return nil
}

// Heartbeat implements regional.Store with a sorted set per region,
// scored by expiry.
func (s *Store) Heartbeat(ctx context.Context, _ time.Time, region, instance string, ttl time.Duration) (int, error) {
	calls := []call{{script: &membersScript, keys: []string{s.key("members:" + region)}, args: []any{instance, ttl.Milliseconds()}}}
	if err := s.do(ctx, "heartbeat", calls); err != nil {
		return 0, err
	}
	v, err := ints(calls[0].reply, 0, 1)
	if err != nil {
		return 0, err
	}
	return int(v[0]), nil
}
