package demo

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot"
)

// Story is what the demo plays: chapters one after the other. The zero
// value has no chapter and lasts 0.
type Story struct {
	Chapters []Chapter
}

// Chapter is one part of a story: for its duration the traffic follows
// its flows and the regions in Cut are cut off from the coordinator and
// their peers.
type Chapter struct {
	Title    string
	Text     string // what to watch, a sentence or two
	Duration time.Duration
	Cut      []string // regions cut off during the chapter
	Flows    []Flow
}

// Flow is one stream of requests, with a rate per region.
type Flow struct {
	Name       string
	Domain     string
	Descriptor allot.Descriptor
	// Spread, when set, is a key of Descriptor whose value gets a number
	// from 1 to Keys appended, in turn, so that the flow spreads over
	// Keys keys (users, IPs).
	Spread string
	Keys   int
	// Rates are requests (or reservations) per second, by region.
	Rates map[string]float64
	// LLM, when set, makes the flow's requests token reservations:
	// Reserve, then Settle with the real usage after Hold.
	LLM *LLM
	// Watch shows the flow's key as rows of its own (KeyRow): for every
	// limit it matches, the key's share in each region and the flow's
	// decisions. Not with Spread.
	Watch bool
}

// KeyRow names the row of a watched flow's key under limit
// ("domain/limit"): api/per-user{user=42}.
func KeyRow(limit string, d allot.Descriptor) string {
	var b strings.Builder
	b.WriteString(limit)
	b.WriteString("{")
	for i, e := range d {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(e.Key + "=" + e.Value)
	}
	b.WriteString("}")
	return b.String()
}

// LLM shapes a flow's token reservations.
type LLM struct {
	Model          string
	PromptTokens   int64
	MaxTokens      int64
	OutMin, OutMax int64         // real output tokens, drawn uniformly
	Hold           time.Duration // how long a call streams before it settles
}

// Total is the story's duration.
func (s Story) Total() time.Duration {
	var t time.Duration
	for _, c := range s.Chapters {
		t += c.Duration
	}
	return t
}

// Position is where a story is at some instant.
type Position struct {
	Round   int           // 1 for the first playing of the story
	Chapter int           // index into Story.Chapters
	Into    time.Duration // time since the chapter started
	Elapsed time.Duration // time since the round started
	Done    bool          // past the end of the first round, when playing once
}

// At returns the position at elapsed time since the story started. When
// once is false the story repeats; when true, every instant from the end
// on is the end (Done, in the last chapter). A story without chapters is
// always Done.
func (s Story) At(elapsed time.Duration, once bool) Position {
	total := s.Total()
	if total <= 0 || len(s.Chapters) == 0 {
		return Position{Round: 1, Done: true}
	}
	elapsed = max(elapsed, 0)
	round := int(elapsed / total)
	if once && round > 0 {
		last := len(s.Chapters) - 1
		return Position{Round: 1, Chapter: last, Into: s.Chapters[last].Duration, Elapsed: total, Done: true}
	}
	in := elapsed % total
	p := Position{Round: round + 1, Elapsed: in}
	for i, c := range s.Chapters {
		if in < c.Duration || i == len(s.Chapters)-1 {
			p.Chapter, p.Into = i, in
			return p
		}
		in -= c.Duration
	}
	return p
}

// Scaled returns the story played speed times faster: every duration
// (chapters and LLM holds) divided by speed. Rates do not change: limits
// are per second whatever the story's pace.
func (s Story) Scaled(speed float64) Story {
	if speed <= 0 || speed == 1 {
		return s
	}
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	out := Story{Chapters: make([]Chapter, len(s.Chapters))}
	for i, c := range s.Chapters {
		c.Duration = scale(c.Duration)
		c.Flows = slices.Clone(c.Flows)
		for j, f := range c.Flows {
			if f.LLM != nil {
				llm := *f.LLM
				llm.Hold = scale(llm.Hold)
				c.Flows[j].LLM = &llm
			}
		}
		out.Chapters[i] = c
	}
	return out
}

// Validate reports a story that cannot be played: no chapter, a
// chapter without duration, a rate for a region not in regions, a
// negative rate, a spread flow without keys or watched, or an LLM flow
// without tokens.
func (s Story) Validate(regions []string) error {
	if len(s.Chapters) == 0 {
		return fmt.Errorf("demo: the story has no chapter")
	}
	for i, c := range s.Chapters {
		if c.Duration <= 0 {
			return fmt.Errorf("demo: chapter %d (%s): duration %v, want > 0", i+1, c.Title, c.Duration)
		}
		for _, r := range c.Cut {
			if !slices.Contains(regions, r) {
				return fmt.Errorf("demo: chapter %d (%s): cuts unknown region %q", i+1, c.Title, r)
			}
		}
		for _, f := range c.Flows {
			for r, v := range f.Rates {
				if !slices.Contains(regions, r) {
					return fmt.Errorf("demo: chapter %d (%s): flow %s: unknown region %q", i+1, c.Title, f.Name, r)
				}
				if v < 0 {
					return fmt.Errorf("demo: chapter %d (%s): flow %s: rate %v in %s, want ≥ 0", i+1, c.Title, f.Name, v, r)
				}
			}
			if f.Spread != "" && f.Keys < 1 {
				return fmt.Errorf("demo: chapter %d (%s): flow %s: spread over %d keys, want ≥ 1", i+1, c.Title, f.Name, f.Keys)
			}
			if f.Spread != "" && f.Watch {
				return fmt.Errorf("demo: chapter %d (%s): flow %s: a spread flow has no one key to watch", i+1, c.Title, f.Name)
			}
			if f.LLM != nil && (f.LLM.PromptTokens < 0 || f.LLM.MaxTokens <= 0 || f.LLM.OutMin < 0 || f.LLM.OutMax < f.LLM.OutMin) {
				return fmt.Errorf("demo: chapter %d (%s): flow %s: bad token shape %+v", i+1, c.Title, f.Name, *f.LLM)
			}
		}
	}
	return nil
}

// DefaultStory is the story allot demo plays on the built-in example
// limits (deploy/examples/limits.yaml) with three regions, about two
// minutes long: steady traffic, a demand shift from regions[0] to
// regions[1], regions[2] cut off and healed, and a burst of LLM token
// reservations from regions[0]. With fewer than three regions it returns
// a steady chapter only.
func DefaultStory(regions []string) Story {
	per := func(rates ...float64) map[string]float64 {
		m := map[string]float64{}
		for i, r := range regions {
			if i < len(rates) {
				m[r] = rates[i]
			}
		}
		return m
	}
	all := func(rate float64) map[string]float64 {
		m := map[string]float64{}
		for _, r := range regions {
			m[r] = rate
		}
		return m
	}
	hot := func(rates map[string]float64) Flow {
		return Flow{Name: "user 42", Domain: "api", Descriptor: allot.Descriptor{{Key: "user", Value: "42"}}, Rates: rates, Watch: true}
	}
	chat := Flow{Name: "globex chat", Domain: "api", Rates: all(4), Spread: "user", Keys: 20,
		Descriptor: allot.Descriptor{{Key: "tenant", Value: "globex"}, {Key: "user", Value: "g"}, {Key: "route", Value: "/v1/chat"}}}
	llm := func(rates map[string]float64) Flow {
		return Flow{Name: "acme LLM calls", Domain: "llm", Descriptor: allot.Descriptor{{Key: "tenant", Value: "acme"}}, Rates: rates,
			LLM: &LLM{Model: "demo-large", PromptTokens: 2000, MaxTokens: 8000, OutMin: 1000, OutMax: 6000, Hold: 3 * time.Second}}
	}
	steady := []Flow{hot(all(8)), chat, llm(all(1))}
	if len(regions) < 3 {
		return Story{Chapters: []Chapter{{Title: "Steady traffic", Duration: 2 * time.Minute, Flows: steady,
			Text: "Every region sends the same traffic. allot demo tells its full story with three regions (--regions)."}}}
	}
	a, b, c := regions[0], regions[1], regions[2]
	bot := Flow{Name: "login bot", Domain: "api", Rates: per(0, 0, 0), Spread: "ip", Keys: 3,
		Descriptor: allot.Descriptor{{Key: "route", Value: "/login"}, {Key: "ip", Value: "203.0.113."}}}
	bot.Rates[b] = 2
	shift := hot(per(2, 20, 2))
	cutRates := per(2, 12, 10)
	return Story{Chapters: []Chapter{
		{Title: "Steady traffic", Duration: 25 * time.Second, Flows: append(slices.Clone(steady), bot),
			Text: fmt.Sprintf("User 42 sends 8 requests/s from each region: 24/s of its 30/s (limit per-user, split mode). "+
				"globex's chat users and a trickle of LLM calls everywhere; a login bot in %s hits login-attempts (5/min per IP).", b)},
		{Title: "Demand shift", Duration: 25 * time.Second, Flows: []Flow{shift, chat, llm(all(1)), bot},
			Text: fmt.Sprintf("User 42's traffic moves from %s to %s (2/s and 20/s). %s rejects until the coordinator, every "+
				"rebalance period, moves share to where the demand is: user 42's own share first (a hot key: row {user=42}), "+
				"then the limit's. The shares of a key never sum above 1.", a, b, b)},
		{Title: c + " cut off", Duration: 25 * time.Second, Cut: []string{c}, Flows: []Flow{hot(cutRates), chat, llm(all(1)), bot},
			Text: fmt.Sprintf("%s loses the coordinator and its peers, and user 42's demand there rises to 10/s. %s keeps enforcing "+
				"the share it had, which the coordinator freezes: it rejects what is above it, the global limit holds, and the "+
				"coordinator rebalances between the other regions.", c, c)},
		{Title: c + " healed", Duration: 15 * time.Second, Flows: []Flow{hot(cutRates), chat, llm(all(1)), bot},
			Text: fmt.Sprintf("The links are back: %s reports its demand again, the coordinator moves share to it, and its "+
				"rejections stop.", c)},
		{Title: "LLM burst", Duration: 20 * time.Second, Flows: []Flow{hot(all(8)), chat, llm(per(60, 1, 1)), bot},
			Text: fmt.Sprintf("%s sends 60 LLM calls/s for tenant acme (2,000-token prompts, up to 8,000 out) against 2M tokens/min. "+
				"Reserve holds the prompt + a learned estimate, Settle charges the real output: the budget runs out, calls get "+
				"Retry-After, and the token budget's share moves to %s.", a, a)},
		{Title: "Calm", Duration: 10 * time.Second, Flows: append(slices.Clone(steady), bot),
			Text: "Back to steady traffic: every region again holds what it uses plus headroom, so user 42 passes everywhere; " +
				"the spare share stays with the regions that peaked recently (a claim that halves every minute) until another region needs it."},
	}}
}

// WatchedKey is a watched flow's key.
type WatchedKey struct {
	Domain     string
	Descriptor allot.Descriptor
}

// Watched returns the keys of the story's watched flows, each once, in
// order of appearance.
func (s Story) Watched() []WatchedKey {
	var out []WatchedKey
	seen := map[string]bool{}
	for _, c := range s.Chapters {
		for _, f := range c.Flows {
			if id := KeyRow(f.Domain, f.Descriptor); f.Watch && !seen[id] {
				seen[id] = true
				out = append(out, WatchedKey{Domain: f.Domain, Descriptor: f.Descriptor})
			}
		}
	}
	return out
}
