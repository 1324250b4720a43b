package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Defaults of Options.
const (
	DefaultInterval = time.Second
	DefaultTick     = 50 * time.Millisecond
)

// Region is one region the demo plays against.
type Region struct {
	Name string
	Addr string // its enforcer's gRPC address (RateLimiter and Admin)
}

// Cutter cuts regions off from the coordinator and their peers, and
// heals them (Links).
type Cutter interface {
	Cut(region string)
	Heal(region string)
}

// Options configure Run.
type Options struct {
	Story   Story
	Regions []Region
	// Links cut and heal the regions the chapters name; nil: the
	// chapters only tell.
	Links Cutter
	// Series receives a sample every Interval; nil: Run keeps its own.
	Series *Series
	// Out receives the terminal view every Interval; nil: none. ANSI
	// redraws it in place (a terminal); otherwise frames follow each
	// other as plain lines.
	Out  io.Writer
	ANSI bool
	// Header is added to the view's first line (the dashboard's URL).
	Header string
	// Interval is how often the view redraws and a sample is taken;
	// 0 means DefaultInterval. Tick is how often traffic is sent; 0 means
	// DefaultTick.
	Interval, Tick time.Duration
	// Once ends Run when the story ends; otherwise it starts over until
	// ctx ends.
	Once bool
	// Seed seeds the random choices (LLM output lengths).
	Seed   uint64
	Logger *slog.Logger
	// Credentials secure the connections to the regions (TLS with a
	// client certificate: the regions' Admin API requires one when they
	// run TLS); nil means plain text.
	Credentials credentials.TransportCredentials
}

// state is where the story is, shared by the traffic and the sampler.
type state struct {
	mu  sync.Mutex
	pos Position
	cut []string
}

func (s *state) set(p Position, cut []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pos, s.cut = p, cut
}

func (s *state) get() (Position, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos, slices.Clone(s.cut)
}

// Run plays opts.Story against opts.Regions until it ends (Once) or ctx
// ends, and returns nil then; it returns an error only when it cannot
// start. Every cut region is healed and every reservation settled
// before it returns.
func Run(ctx context.Context, opts Options) error {
	if len(opts.Regions) == 0 {
		return errors.New("demo: no region")
	}
	names := make([]string, len(opts.Regions))
	for i, r := range opts.Regions {
		names[i] = r.Name
	}
	if err := opts.Story.Validate(names); err != nil {
		return err
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Tick <= 0 {
		opts.Tick = DefaultTick
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Series == nil {
		opts.Series = NewSeries(names, opts.Story, opts.Interval, 0)
	}
	limiters := map[string]allotv1.RateLimiterClient{}
	admins := map[string]allotv1.AdminClient{}
	for _, r := range opts.Regions {
		creds := opts.Credentials
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		cc, err := grpc.NewClient(r.Addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return fmt.Errorf("demo: region %s at %s: %w", r.Name, r.Addr, err)
		}
		defer cc.Close()
		limiters[r.Name], admins[r.Name] = allotv1.NewRateLimiterClient(cc), allotv1.NewAdminClient(cc)
	}
	tally := &Tally{}
	tr := newTraffic(names, limiters, tally, rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x5eed)), opts.Logger)
	st := &state{}
	start := time.Now()
	st.set(opts.Story.At(0, opts.Once), nil)

	sctx, stopSampler := context.WithCancel(ctx)
	sampler := &sampler{opts: opts, names: names, watched: opts.Story.Watched(), admins: admins, tally: tally, st: st, start: start, last: start}
	done := make(chan struct{})
	go func() { sampler.run(sctx); close(done) }()

	cut := map[string]bool{}
	setCut := func(want []string) {
		for r := range cut {
			if !slices.Contains(want, r) {
				if opts.Links != nil {
					opts.Links.Heal(r)
				}
				delete(cut, r)
				opts.Logger.Info("demo: region healed", "region", r)
			}
		}
		for _, r := range want {
			if !cut[r] {
				if opts.Links != nil {
					opts.Links.Cut(r)
				}
				cut[r] = true
				opts.Logger.Info("demo: region cut off", "region", r)
			}
		}
	}
	t := time.NewTicker(opts.Tick)
	defer t.Stop()
	last := start
	var final Position
	for {
		now := time.Now()
		pos := opts.Story.At(now.Sub(start), opts.Once)
		if pos.Done || ctx.Err() != nil {
			final = pos
			break
		}
		ch := &opts.Story.Chapters[pos.Chapter]
		setCut(ch.Cut)
		st.set(pos, slices.Sorted(maps.Keys(cut)))
		tr.tick(ctx, ch, now.Sub(last))
		last = now
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	setCut(nil)
	tr.wait()
	stopSampler()
	<-done
	if ctx.Err() == nil {
		sampler.end(final)
	}
	if n := tr.dropped.Load(); n > 0 {
		opts.Logger.Warn("demo: requests dropped, too many in flight", "dropped", n)
	}
	return nil
}

// sampler takes a sample every Interval and redraws the view.
type sampler struct {
	opts    Options
	names   []string
	watched []WatchedKey
	admins  map[string]allotv1.AdminClient
	tally   *Tally
	st      *state
	start   time.Time
	last    time.Time // of the previous sample

	latest  Sample // the previous sample, once sampled
	sampled bool
}

func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sample(ctx)
		}
	}
}

// sample reads the regions' shares and the decisions counted since the
// previous sample, adds them to the Series and redraws the view. A
// sample cut short by ctx is dropped.
func (s *sampler) sample(ctx context.Context) {
	if smp, pos, ok := s.take(ctx); ok {
		s.draw(pos, smp, false)
	}
}

// end takes the last sample, of the traffic since the previous one, and
// draws it as the end of the story at pos; when the previous sample is
// less than half an interval old, it draws that one instead (rates over
// a sliver of time are noise). Call it once run has returned and the
// traffic has stopped.
func (s *sampler) end(pos Position) {
	s.st.set(pos, nil)
	smp := s.latest
	if !s.sampled || time.Since(s.last) >= s.opts.Interval/2 {
		smp, _, _ = s.take(context.Background())
	}
	s.draw(pos, smp, true)
}

func (s *sampler) take(ctx context.Context) (Sample, Position, bool) {
	shares, limits := s.shares(ctx)
	if ctx.Err() != nil {
		return Sample{}, Position{}, false
	}
	now := time.Now()
	pos, cut := s.st.get()
	smp := s.opts.Series.Add(Reading{At: now.Sub(s.start), Window: now.Sub(s.last), Position: pos, Cut: cut,
		Limits: limits, Shares: shares, Counts: s.tally.Take()})
	s.last, s.latest, s.sampled = now, smp, true
	return smp, pos, true
}

func (s *sampler) draw(pos Position, smp Sample, final bool) {
	if s.opts.Out == nil {
		return
	}
	err := writeFrame(s.opts.Out, frame{Header: s.opts.Header, Story: s.opts.Story, Once: s.opts.Once, Pos: pos, Regions: s.names,
		Sample: smp, Limits: s.opts.Series.Limits(), Interval: s.opts.Interval, Final: final}, s.opts.ANSI)
	if err != nil {
		s.opts.Logger.Warn("demo: view not written", "err", err)
	}
}

// shares asks every region for the shares in force (allot.v1.Admin
// Status; Usage for the watched keys), region → row → share, and the
// rows in the order the regions list the limits, each limit followed by
// its watched keys. A region that does not answer in time is missing.
func (s *sampler) shares(ctx context.Context) (map[string]map[string]float64, []string) {
	timeout := min(s.opts.Interval, time.Second)
	type answer struct {
		region string
		status *allotv1.StatusResponse
		keys   map[string]float64 // key row → share
		rows   map[string][]string
	}
	answers := make(chan answer, len(s.names))
	for _, r := range s.names {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			a := answer{region: r, keys: map[string]float64{}, rows: map[string][]string{}}
			resp, err := s.admins[r].Status(cctx, &allotv1.StatusRequest{})
			if err == nil {
				a.status = resp
			}
			for _, w := range s.watched {
				req := &allotv1.UsageRequest{Domain: w.Domain}
				for _, e := range w.Descriptor {
					req.Descriptor_ = append(req.Descriptor_, &allotv1.Entry{Key: e.Key, Value: e.Value})
				}
				u, err := s.admins[r].Usage(cctx, req)
				if err != nil {
					continue
				}
				for _, lu := range u.GetGlobal() {
					limit := w.Domain + "/" + lu.GetLimit()
					row := KeyRow(limit, w.Descriptor)
					a.keys[row] = lu.GetShare()
					a.rows[limit] = append(a.rows[limit], row)
				}
			}
			answers <- a
		}()
	}
	byRegion := map[string]answer{}
	for range s.names {
		a := <-answers
		byRegion[a.region] = a
	}
	out := map[string]map[string]float64{}
	var limits []string
	add := func(row string) {
		if !slices.Contains(limits, row) {
			limits = append(limits, row)
		}
	}
	for _, r := range s.names { // in region order, for a stable row order
		a := byRegion[r]
		if a.status == nil {
			continue
		}
		out[r] = map[string]float64{}
		for _, rs := range a.status.GetRegions() {
			for _, d := range rs.GetDomains() {
				for _, l := range d.GetLimits() {
					name := d.GetName() + "/" + l.GetName()
					out[r][name] = l.GetShare()
					add(name)
					for _, row := range a.rows[name] {
						out[r][row] = a.keys[row]
						add(row)
					}
				}
			}
		}
	}
	return out, limits
}
