package allot

import (
	"errors"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	good := []struct {
		in   string
		want Rate
		str  string
	}{
		{"1000/1m", Rate{1000, time.Minute}, "1000/m"},
		{"5/s", Rate{5, time.Second}, "5/s"},
		{"2M/1h", Rate{2_000_000, time.Hour}, "2000000/h"},
		{"100/10s", Rate{100, 10 * time.Second}, "100/10s"},
		{"1k/500ms", Rate{1000, 500 * time.Millisecond}, "1000/500ms"},
		{"10/1d", Rate{10, 24 * time.Hour}, "10/d"},
		{" 3G / 90min ", Rate{3_000_000_000, 90 * time.Minute}, "3000000000/90m"},
		{"1/366d", Rate{1, 366 * 24 * time.Hour}, "1/366d"},
		{"1125899906842/1ms", Rate{MaxAmountIn(time.Millisecond), time.Millisecond}, "1125899906842/ms"}, // MaxRate at the shortest period
		{"1125899906842624/1s", MaxRate, "1125899906842624/s"},
	}
	for _, tc := range good {
		got, err := ParseRate(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		if s := got.String(); s != tc.str {
			t.Errorf("%v.String() = %q, want %q", got, s, tc.str)
		}
		if back, err := ParseRate(got.String()); err != nil || back != got {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", got.String(), back, err, got)
		}
	}

	bad := []struct{ in, want string }{
		{"0/1m", `allot: bad rate "0/1m": amount: want a positive integer with optional k, M or G suffix, got "0"`},
		{"-1/s", `allot: bad rate "-1/s": amount: want a positive integer with optional k, M or G suffix, got "-1"`},
		{"1/0s", `allot: bad rate "1/0s": period: want a positive count, got "0"`},
		{"abc", `allot: bad rate "abc": want AMOUNT/PERIOD such as 1000/1m`},
		{"10/1y", `allot: bad rate "10/1y": period: want a unit ms, s, m, h or d, got "1y"`},
		{"10/", `allot: bad rate "10/": period: want a unit ms, s, m, h or d, got ""`},
		{"1.5/s", `allot: bad rate "1.5/s": amount: want a positive integer with optional k, M or G suffix, got "1.5"`},
		{"99999999999999999999/s", `allot: bad rate "99999999999999999999/s": amount: want a positive integer with optional k, M or G suffix, got "99999999999999999999"`},
		{"9223372036854775807G/s", `allot: bad rate "9223372036854775807G/s": amount: must be at most 1125899906842624`},
		{"1125899906842625/s", `allot: bad rate "1125899906842625/s": amount: must be at most 1125899906842624`},
		{"1125899906842624/1ms", `allot: bad rate "1125899906842624/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`},
		{"1/367d", `allot: bad rate "1/367d": period: must be at most 366d`},
		{"1/9999999999999999999ms", `allot: bad rate "1/9999999999999999999ms": period: want a positive count, got "9999999999999999999"`},
	}
	for _, tc := range bad {
		r, err := ParseRate(tc.in)
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrBadRate) {
			t.Errorf("ParseRate(%q) = %v, %v; want error %s", tc.in, r, err, tc.want)
		}
	}
}

func TestRateText(t *testing.T) {
	var r Rate
	if err := r.UnmarshalText([]byte("2k/30s")); err != nil || r != (Rate{2000, 30 * time.Second}) {
		t.Fatalf("UnmarshalText = %v, %v", r, err)
	}
	if b, _ := r.MarshalText(); string(b) != "2000/30s" {
		t.Errorf("MarshalText = %s", b)
	}
	if err := r.UnmarshalText([]byte("x")); !errors.Is(err, ErrBadRate) || r != (Rate{2000, 30 * time.Second}) {
		t.Errorf("UnmarshalText(x) = %v, rate %v", err, r)
	}
}
