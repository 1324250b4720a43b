package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Errors of a request, mapped to gRPC codes by grpcError.
var (
	// ErrBadRequest is returned for a request missing a field or holding
	// a bad value (INVALID_ARGUMENT).
	ErrBadRequest = errors.New("admin: bad request")
	// ErrNotFound is returned for a limit, override or plan assignment
	// that does not exist (NOT_FOUND).
	ErrNotFound = errors.New("admin: not found")
	// ErrStale is returned when expect_version is not the current version
	// (ABORTED).
	ErrStale = errors.New("admin: not the current version")
	// ErrNotOperator is returned for a write over TLS whose caller's
	// certificate does not have the operator role (PERMISSION_DENIED).
	ErrNotOperator = errors.New("admin: only an operator's certificate may change the fleet")
)

// Defaults of Options.
const (
	DefaultRegionTimeout = 2 * time.Second
	defaultHistory       = 50
)

// Options configure a Server.
type Options struct {
	Store *etcdstore.Store
	// RegionTimeout bounds each region's answer in Usage and Status.
	RegionTimeout time.Duration
	// Credentials secure the connections to the regions' Admin API (TLS
	// with the coordinator's client certificate: a region's Admin requires
	// one when it runs TLS); nil means plain text.
	Credentials credentials.TransportCredentials
	// Authorization decides the roles of callers over TLS (reads need
	// viewer, writes operator: methodRoles). nil means the roles of each
	// identity's kind (tlsx.Identity.Roles: an operator's certificate may
	// read and write, a coordinator's read) and none for a certificate
	// without an identity. Callers in plain text may do everything.
	Authorization *tlsx.Policy
	// Registry, when set, receives the refusals counter.
	Registry prometheus.Registerer
	// Logger receives every change made, at info level; nil discards.
	Logger *slog.Logger
	// Now reads the clock; nil means time.Now.
	Now func() time.Time
}

// Server serves allot.v1.Admin. Safe for concurrent use; the zero value
// is not usable, call New.
type Server struct {
	allotv1.UnimplementedAdminServer
	store    *etcdstore.Store
	opts     Options
	log      *slog.Logger
	policy   *tlsx.Policy
	refusals *prometheus.CounterVec

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // region address → connection
}

// New returns a Server storing in opts.Store.
func New(opts Options) *Server {
	if opts.RegionTimeout <= 0 {
		opts.RegionTimeout = DefaultRegionTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	policy := opts.Authorization
	if policy == nil {
		policy = &tlsx.Policy{}
	}
	return &Server{store: opts.Store, opts: opts, log: opts.Logger.With("component", "admin"), conns: map[string]*grpc.ClientConn{},
		policy: policy, refusals: newRefusals(opts.Registry)}
}

// Close closes the connections to the regions.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, cc := range s.conns {
		cc.Close()
		delete(s.conns, addr)
	}
}

// grpcError maps an error to its gRPC status: the one table of this edge.
func grpcError(err error) error {
	code := codes.Unavailable // etcd unreachable, mostly
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, allot.ErrConfig), errors.Is(err, allot.ErrBadRate):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound), errors.Is(err, etcdstore.ErrNoVersion):
		code = codes.NotFound
	case errors.Is(err, etcdstore.ErrNoConfig):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrNotOperator):
		code = codes.PermissionDenied
	case errors.Is(err, ErrStale), errors.Is(err, etcdstore.ErrConflict):
		code = codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

// writer checks that a write's caller may make it and returns the author
// to record. Over TLS only a caller with the operator role may (an
// operator's certificate, spiffe://DOMAIN/operator/NAME, or an identity
// granted the role), and the author is that NAME (else the identity's
// URI), whatever the request says. In plain text (loopback only) anyone
// may, and the author is what the request says, else the caller's
// address.
func (s *Server) writer(ctx context.Context, said string) (string, error) {
	c, secured := s.callerRoles(ctx)
	switch {
	case !secured:
	case c.Anonymous():
		return "", fmt.Errorf("%w: the certificate names no allot identity (spiffe://DOMAIN/operator/NAME)", ErrNotOperator)
	case !c.Roles.Has(tlsx.RoleOperator):
		return "", fmt.Errorf("%w (spiffe://DOMAIN/operator/NAME); %s is not one", ErrNotOperator, c.Identity.URI)
	case c.Identity.Operator != "":
		return c.Identity.Operator, nil
	default:
		return c.Identity.URI, nil
	}
	if said != "" {
		return said, nil
	}
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr.String(), nil
	}
	return "unknown", nil
}

// current returns the fleet's state and the latest version (0: none).
func (s *Server) current(ctx context.Context) (etcdstore.Fleet, etcdstore.ConfigVersion, error) {
	fl, err := s.store.Fleet(ctx)
	if err != nil {
		return fl, etcdstore.ConfigVersion{}, err
	}
	v, err := s.store.Version(ctx, 0)
	if errors.Is(err, etcdstore.ErrNoConfig) {
		err = nil
	}
	return fl, v, err
}

// currentConfig parses the configuration in force, nil if there is none.
func currentConfig(fl etcdstore.Fleet) (*allot.Config, error) {
	if fl.YAML == nil {
		return nil, nil
	}
	return allot.ParseConfig("etcd:config@"+strconv.FormatInt(fl.Version, 10), fl.YAML)
}

// change is a configuration write.
type change struct {
	yaml       []byte
	file       string // names the YAML in errors
	dryRun     bool
	author     string
	summary    string // "": the changes summed up
	expect     *int64
	rollbackOf int64
}

// apply validates c.yaml, checks the fleet's overrides and plan
// assignments fit it, and stores it as a new version unless it is a dry
// run or the same file as the one in force.
func (s *Server) apply(ctx context.Context, c change) (*allotv1.ApplyConfigResponse, error) {
	cfg, err := allot.ParseConfig(c.file, c.yaml)
	if err != nil {
		return nil, err
	}
	fl, cur, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	if c.expect != nil && *c.expect != cur.Version {
		return nil, fmt.Errorf("%w: expected version %d, the current one is %d", ErrStale, *c.expect, cur.Version)
	}
	if _, err := cfg.WithDynamic(fl.Dynamic()); err != nil {
		return nil, fmt.Errorf("%s: the fleet's overrides and plan assignments must fit it; change or delete these first:\n%w", c.file, err)
	}
	old, _ := currentConfig(fl) // one that does not parse diffs as nothing
	changes := Diff(old, cfg)
	resp := &allotv1.ApplyConfigResponse{Version: versionProto(cur, false), Changes: changesProto(changes)}
	if c.dryRun || bytes.Equal(c.yaml, fl.YAML) {
		return resp, nil
	}
	if c.summary == "" {
		c.summary = summarize(changes)
	}
	v, err := s.store.ApplyConfig(ctx, cur.Version, etcdstore.ConfigVersion{
		Time: s.opts.Now().UTC(), Author: c.author, Summary: c.summary, RollbackOf: c.rollbackOf, YAML: string(c.yaml)})
	if err != nil {
		return nil, err
	}
	s.log.Info("configuration applied", "version", v.Version, "author", v.Author, "summary", v.Summary)
	resp.Version, resp.Applied = versionProto(v, false), true
	return resp, nil
}

// summarize sums changes up in a line for History.
func summarize(changes []Change) string {
	if len(changes) == 0 {
		return "no change to limits (comments or layout)"
	}
	var parts []string
	for _, c := range changes[:min(len(changes), 3)] {
		parts = append(parts, formatChange(c))
	}
	if n := len(changes) - 3; n > 0 {
		parts = append(parts, fmt.Sprintf("%d more", n))
	}
	return strings.Join(parts, "; ")
}

// formatChange formats a change in a line: "+ api limits/x rate=…",
// "- api limits/x …", "~ api limits/x.rate: 1000/m → 2000/m".
func formatChange(c Change) string {
	what := strings.TrimSpace(c.Domain + " " + c.Path)
	switch {
	case c.Old == "":
		return "+ " + what + " " + c.New
	case c.New == "":
		return "- " + what + " " + c.Old
	}
	return fmt.Sprintf("~ %s: %s → %s", what, c.Old, c.New)
}

// GetConfig returns a version of the configuration, with its YAML.
func (s *Server) GetConfig(ctx context.Context, req *allotv1.GetConfigRequest) (*allotv1.ConfigVersion, error) {
	v, err := s.store.Version(ctx, req.GetVersion())
	if err != nil {
		return nil, grpcError(err)
	}
	return versionProto(v, true), nil
}

// ApplyConfig validates a file and stores it as a new version.
func (s *Server) ApplyConfig(ctx context.Context, req *allotv1.ApplyConfigRequest) (*allotv1.ApplyConfigResponse, error) {
	author, err := s.writer(ctx, req.GetAuthor())
	if err != nil {
		return nil, grpcError(err)
	}
	if req.GetFile() == "" {
		req.File = "config"
	}
	resp, err := s.apply(ctx, change{yaml: []byte(req.GetYaml()), file: req.GetFile(), dryRun: req.GetDryRun(),
		author: author, summary: req.GetSummary(), expect: req.ExpectVersion})
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// Rollback stores an earlier version's configuration as a new version.
func (s *Server) Rollback(ctx context.Context, req *allotv1.RollbackRequest) (*allotv1.ApplyConfigResponse, error) {
	author, err := s.writer(ctx, req.GetAuthor())
	if err != nil {
		return nil, grpcError(err)
	}
	cur, err := s.store.Version(ctx, 0)
	if err != nil {
		return nil, grpcError(err)
	}
	target := req.GetVersion()
	if target == 0 {
		target = cur.Version - 1
	}
	if target < 1 || target > cur.Version {
		return nil, grpcError(fmt.Errorf("%w: no version %d to roll back to (the current one is %d)", ErrBadRequest, target, cur.Version))
	}
	v, err := s.store.Version(ctx, target)
	if err != nil {
		return nil, grpcError(err)
	}
	resp, err := s.apply(ctx, change{yaml: []byte(v.YAML), file: fmt.Sprintf("version %d", target), dryRun: req.GetDryRun(),
		author: author, summary: fmt.Sprintf("rollback to version %d", target),
		expect: &cur.Version, rollbackOf: target})
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// UpdateLimit sets one limit's shadow flag or mode in the configuration in
// force and stores the result as a new version.
func (s *Server) UpdateLimit(ctx context.Context, req *allotv1.UpdateLimitRequest) (*allotv1.ApplyConfigResponse, error) {
	author, err := s.writer(ctx, req.GetAuthor())
	if err != nil {
		return nil, grpcError(err)
	}
	fl, cur, err := s.current(ctx)
	switch {
	case err != nil:
	case fl.YAML == nil:
		err = etcdstore.ErrNoConfig
	case req.GetLimit() == "":
		err = fmt.Errorf("%w: no limit named", ErrBadRequest)
	case (req.Shadow == nil) == (req.Mode == nil):
		err = fmt.Errorf("%w: want exactly one of shadow and mode", ErrBadRequest)
	case req.Mode != nil && req.GetMode() != allot.Split.String() && req.GetMode() != allot.Shared.String():
		err = fmt.Errorf("%w: mode %q, want split or shared", ErrBadRequest, req.GetMode())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	field, value, tag := "mode", req.GetMode(), "!!str"
	if req.Shadow != nil {
		field, value, tag = "shadow", strconv.FormatBool(req.GetShadow()), "!!bool"
	}
	yaml, domain, err := setLimitField(fl.YAML, req.GetDomain(), req.GetLimit(), field, value, tag)
	if err != nil {
		return nil, grpcError(err)
	}
	summary := fmt.Sprintf("limits mode %s %s", req.GetLimit(), value)
	if req.Shadow != nil {
		summary = fmt.Sprintf("limits shadow %s %s", req.GetLimit(), strings.NewReplacer("true", "on", "false", "off").Replace(value))
	}
	resp, err := s.apply(ctx, change{yaml: yaml, file: fmt.Sprintf("version %d (%s/%s %s → %s)", cur.Version, domain, req.GetLimit(), field, value),
		author: author, summary: summary, expect: &cur.Version})
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// History lists the versions, newest first, without their YAML.
func (s *Server) History(ctx context.Context, req *allotv1.HistoryRequest) (*allotv1.HistoryResponse, error) {
	n := int(req.GetLimit())
	if n <= 0 {
		n = defaultHistory
	}
	vs, err := s.store.History(ctx, n)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &allotv1.HistoryResponse{}
	for _, v := range vs {
		resp.Versions = append(resp.Versions, versionProto(v, false))
	}
	return resp, nil
}

func versionProto(v etcdstore.ConfigVersion, withYAML bool) *allotv1.ConfigVersion {
	if v.Version == 0 {
		return &allotv1.ConfigVersion{}
	}
	p := &allotv1.ConfigVersion{Version: v.Version, Time: timestamppb.New(v.Time), Author: v.Author, Summary: v.Summary, RollbackOf: v.RollbackOf}
	if withYAML {
		p.Yaml = v.YAML
	}
	return p
}

func changesProto(cs []Change) []*allotv1.ConfigChange {
	out := make([]*allotv1.ConfigChange, len(cs))
	for i, c := range cs {
		out[i] = &allotv1.ConfigChange{Domain: c.Domain, Path: c.Path, Old: c.Old, New: c.New}
	}
	return out
}
