package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Sample is one series of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape is the samples of one instance's /metrics at the end of one of
// its lifetimes (the load client had stopped sending to it).
type Scrape struct {
	Instance string
	Life     int
	Samples  []Sample
}

// Sum adds the values of the series named name whose labels include
// every pair of match.
func Sum(samples []Sample, name string, match map[string]string) float64 {
	total := 0.0
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			total += s.Value
		}
	}
	return total
}

// Max is the largest value of the series named name (0 when none).
func Max(samples []Sample, name string) float64 {
	m := 0.0
	for _, s := range samples {
		if s.Name == name && s.Value > m {
			m = s.Value
		}
	}
	return m
}

// Fetch reads the samples at url (a /metrics endpoint) with client
// (http.DefaultClient when nil).
func Fetch(ctx context.Context, client *http.Client, url string) ([]Sample, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return ParseText(resp.Body)
}

// ParseText parses the Prometheus text format (comments are skipped).
func ParseText(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w: %q", n, err, line)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, " ,")
			if strings.HasPrefix(line, "}") {
				line = line[1:]
				break
			}
			eq := strings.IndexByte(line, '=')
			if eq <= 0 || len(line) < eq+2 || line[eq+1] != '"' {
				return s, fmt.Errorf("malformed labels")
			}
			name := line[:eq]
			line = line[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(line); j++ {
				c := line[j]
				if c == '\\' && j+1 < len(line) {
					j++
					switch line[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(line[j])
					}
					continue
				}
				if c == '"' {
					line, closed = line[j+1:], true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value")
			}
			s.Labels[name] = val.String()
		}
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}
