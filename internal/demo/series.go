package demo

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// DefaultKeep is how many samples a Series keeps by default: ten minutes
// at one per second.
const DefaultKeep = 600

// Reading is what the demo saw over one interval: the story's position,
// the shares in force in each region and the decisions counted.
type Reading struct {
	At       time.Duration // since the demo started
	Window   time.Duration // what Counts cover; rates are Counts ÷ Window
	Position Position
	Cut      []string
	// Limits orders the limits ("domain/limit") as the regions report
	// them; limits seen only in Counts or Shares come after, sorted.
	Limits []string
	// Shares: region → limit → the share in force there. A region that
	// did not answer is missing: its shares are unknown (null).
	Shares map[string]map[string]float64
	// Counts: region → limit → decisions in Window.
	Counts map[string]map[string]Count
}

// Sample is one point of every series, as the dashboard reads it. Per
// limit, each slice has one value per region, in Series order.
type Sample struct {
	T        float64               `json:"t"` // seconds since the demo started
	Round    int                   `json:"round"`
	Chapter  int                   `json:"chapter"`
	Cut      []string              `json:"cut,omitempty"`
	Shares   map[string][]*float64 `json:"shares"`   // null: unknown
	Admitted map[string][]float64  `json:"admitted"` // per second
	Rejected map[string][]float64  `json:"rejected"` // per second
}

// ChapterInfo is a chapter as the dashboard shows it.
type ChapterInfo struct {
	Title   string   `json:"title"`
	Text    string   `json:"text"`
	Seconds float64  `json:"seconds"`
	Cut     []string `json:"cut,omitempty"`
}

// Snapshot is a Series' content, as /api/series serves it.
type Snapshot struct {
	Regions  []string      `json:"regions"`
	Limits   []string      `json:"limits"`
	Chapters []ChapterInfo `json:"chapters"`
	Interval float64       `json:"interval"` // seconds between samples
	Samples  []Sample      `json:"samples"`
}

// Series keeps the latest samples of a demo: shares, admitted and
// rejected per second, per region and limit. Safe for concurrent use.
type Series struct {
	mu       sync.Mutex
	regions  []string
	limits   []string // every limit seen, in order
	chapters []ChapterInfo
	interval time.Duration
	keep     int
	samples  []Sample // oldest first, at most keep
}

// NewSeries returns an empty Series for regions and story, sampled every
// interval, that keeps the latest keep samples (0: DefaultKeep).
func NewSeries(regions []string, story Story, interval time.Duration, keep int) *Series {
	if keep <= 0 {
		keep = DefaultKeep
	}
	s := &Series{regions: slices.Clone(regions), interval: interval, keep: keep}
	for _, c := range story.Chapters {
		s.chapters = append(s.chapters, ChapterInfo{Title: c.Title, Text: c.Text, Seconds: c.Duration.Seconds(), Cut: c.Cut})
	}
	return s
}

// Add turns r into a sample, keeps it (dropping the oldest beyond keep)
// and returns it.
func (s *Series) Add(r Reading) Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.learn(r)
	smp := Sample{T: r.At.Seconds(), Round: r.Position.Round, Chapter: r.Position.Chapter, Cut: slices.Clone(r.Cut),
		Shares: map[string][]*float64{}, Admitted: map[string][]float64{}, Rejected: map[string][]float64{}}
	secs := r.Window.Seconds()
	for _, l := range s.limits {
		shares := make([]*float64, len(s.regions))
		adm := make([]float64, len(s.regions))
		rej := make([]float64, len(s.regions))
		for i, reg := range s.regions {
			if v, ok := r.Shares[reg][l]; ok {
				shares[i] = &v
			}
			if c, ok := r.Counts[reg][l]; ok && secs > 0 {
				adm[i] = float64(c.Admitted) / secs
				rej[i] = float64(c.Rejected) / secs
			}
		}
		smp.Shares[l], smp.Admitted[l], smp.Rejected[l] = shares, adm, rej
	}
	s.samples = append(s.samples, smp)
	if n := len(s.samples) - s.keep; n > 0 {
		s.samples = slices.Delete(s.samples, 0, n)
	}
	return smp
}

// learn adds the limits r names that s has not seen yet: in r.Limits'
// order, then the others sorted.
func (s *Series) learn(r Reading) {
	for _, l := range r.Limits {
		if !slices.Contains(s.limits, l) {
			s.limits = append(s.limits, l)
		}
	}
	var extra []string
	for _, byLimit := range r.Shares {
		for l := range byLimit {
			extra = append(extra, l)
		}
	}
	for _, byLimit := range r.Counts {
		for l := range byLimit {
			extra = append(extra, l)
		}
	}
	slices.Sort(extra)
	for _, l := range extra {
		if !slices.Contains(s.limits, l) {
			s.limits = append(s.limits, l)
		}
	}
}

// Limits returns the limits seen so far, in order.
func (s *Series) Limits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.limits)
}

// Snapshot returns a copy of what s holds.
func (s *Series) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Snapshot{Regions: slices.Clone(s.regions), Limits: slices.Clone(s.limits), Chapters: slices.Clone(s.chapters),
		Interval: s.interval.Seconds(), Samples: slices.Clone(s.samples)}
}

// MarshalJSON encodes s's Snapshot.
func (s *Series) MarshalJSON() ([]byte, error) {
	return json.Marshal(s.Snapshot())
}
