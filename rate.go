package allot

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// ErrBadRate is returned (wrapped) by ParseRate for a rate string that does
// not parse or describes an impossible rate.
var ErrBadRate = errors.New("allot: bad rate")

// MaxAmount bounds the amount of any rate, burst or cost, so that arithmetic
// on amounts (amount × multiplier, amount × 1e9) cannot overflow.
const MaxAmount = 1 << 50

// Bounds of a rate. A rate's period is in [MinPeriod, MaxPeriod] and it
// carries at most MaxAmount per second: at most MaxAmount over a period of
// a second or more, and proportionally less over a shorter one (about
// 1.1e12 ≈ 2^40 per millisecond, 1.1e6 per nanosecond). The engine holds
// amounts, shares of them and tokens in float64 and time in int64
// nanoseconds; under these bounds:
//   - an amount, a burst, amount × share and a rate per second are at most
//     2^50, where float64 holds integers exactly and keeps two bits below
//     one token (a quarter), so a charge of 1 is never lost to rounding,
//     and a sum of up to 8 of them (regions' demand in a coordinator) of
//     whole amounts stays exact;
//   - refill and wait (amount × ns / period, missing × period / amount)
//     multiply at most 2^50 by at most 2^55 ns (366 days): 2^105, far inside
//     float64's range, so neither overflows or becomes infinite;
//   - window ids (now − now mod period) and window ends (start + 2·period)
//     are int64 nanoseconds that cannot overflow before 2260;
//   - MaxAmountIn multiplies MaxAmount × period in 128 bits.
//
// Not exact: GCRA keeps an instant in int64 nanoseconds, so it counts
// tokens to within what one nanosecond refills, a whole token or less only
// up to 1e9 a second.
//
// So 2^50/1ms (1.1e18 a second) is refused; 1125899906842/1ms is the most
// a millisecond may carry.
const (
	MinPeriod = time.Millisecond
	MaxPeriod = 366 * 24 * time.Hour
)

// MaxRate is the fastest valid rate: MaxAmount per second.
var MaxRate = Rate{Amount: MaxAmount, Period: time.Second}

// MaxAmountIn is the largest amount a valid rate may carry over period:
// MaxAmount for a period of a second or more, MaxAmount × period / 1s
// (rounded down) for a shorter one, and 0 for a period under MinPeriod or
// over MaxPeriod.
func MaxAmountIn(period time.Duration) int64 {
	switch {
	case period < MinPeriod || period > MaxPeriod:
		return 0
	case period >= time.Second:
		return MaxAmount
	}
	hi, lo := bits.Mul64(MaxAmount, uint64(period)) // < 2^80: hi < 1e9
	q, _ := bits.Div64(hi, lo, uint64(time.Second))
	return int64(q)
}

// Rate is an amount per period: 1000/1m is Rate{Amount: 1000, Period: time.Minute}.
// The zero Rate allows nothing and is reported invalid by Validate.
type Rate struct {
	Amount int64
	Period time.Duration
}

// ParseRate parses "AMOUNT/PERIOD". AMOUNT is a positive integer with an
// optional suffix k (×1e3), M (×1e6) or G (×1e9); PERIOD is a unit (ms, s, m,
// h, d) optionally preceded by a positive integer count: 1000/1m, 5/s,
// 2M/1h, 100/10s, 1k/500ms, 10/1d.
func ParseRate(s string) (Rate, error) {
	amt, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w %q: want AMOUNT/PERIOD such as 1000/1m", ErrBadRate, s)
	}
	a, err := parseAmount(strings.TrimSpace(amt))
	if err != nil {
		return Rate{}, fmt.Errorf("%w %q: amount: %v", ErrBadRate, s, err)
	}
	p, err := parsePeriod(strings.TrimSpace(per))
	if err != nil {
		return Rate{}, fmt.Errorf("%w %q: period: %v", ErrBadRate, s, err)
	}
	r := Rate{Amount: a, Period: p}
	if err := r.Validate(); err != nil {
		return Rate{}, fmt.Errorf("%w %q: %v", ErrBadRate, s, err)
	}
	return r, nil
}

// Validate reports whether r describes a possible rate: a positive amount
// of at most MaxAmount over a period between 1ms and 366 days, and at most
// MaxRate (MaxAmount per second; see MaxAmountIn).
func (r Rate) Validate() error {
	switch {
	case r.Amount <= 0:
		return errors.New("amount must be positive")
	case r.Amount > MaxAmount:
		return fmt.Errorf("amount must be at most %d", int64(MaxAmount))
	case r.Period < MinPeriod:
		return errors.New("period must be at least 1ms")
	case r.Period > MaxPeriod:
		return errors.New("period must be at most 366d")
	case r.Amount > MaxAmountIn(r.Period):
		return fmt.Errorf("rate must be at most %d per second, want an amount of at most %d per %v",
			int64(MaxAmount), MaxAmountIn(r.Period), r.Period)
	}
	return nil
}

// PerSecond is the rate's amount per second.
func (r Rate) PerSecond() float64 {
	if r.Period <= 0 {
		return 0
	}
	return float64(r.Amount) / r.Period.Seconds()
}

// String formats r so that ParseRate(r.String()) == r.
func (r Rate) String() string {
	if r.Period <= 0 {
		return fmt.Sprintf("%d/0s", r.Amount)
	}
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}}
	for _, u := range units {
		if r.Period%u.d == 0 {
			n := r.Period / u.d
			if n == 1 {
				return fmt.Sprintf("%d/%s", r.Amount, u.name)
			}
			return fmt.Sprintf("%d/%d%s", r.Amount, n, u.name)
		}
	}
	return fmt.Sprintf("%d/%dns", r.Amount, int64(r.Period))
}

// MarshalText implements encoding.TextMarshaler.
func (r Rate) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseRate.
func (r *Rate) UnmarshalText(b []byte) error {
	v, err := ParseRate(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

func parseAmount(s string) (int64, error) {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1_000, s[:n-1]
		case 'M':
			mult, s = 1_000_000, s[:n-1]
		case 'G':
			mult, s = 1_000_000_000, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("want a positive integer with optional k, M or G suffix, got %q", s)
	}
	if v > math.MaxInt64/mult || v*mult > MaxAmount {
		return 0, fmt.Errorf("must be at most %d", int64(MaxAmount))
	}
	return v * mult, nil
}

func parsePeriod(s string) (time.Duration, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	count := int64(1)
	if i > 0 {
		v, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("want a positive count, got %q", s[:i])
		}
		count = v
	}
	var unit time.Duration
	switch s[i:] {
	case "ms":
		unit = time.Millisecond
	case "s", "sec":
		unit = time.Second
	case "m", "min":
		unit = time.Minute
	case "h", "hour":
		unit = time.Hour
	case "d", "day":
		unit = 24 * time.Hour
	default:
		return 0, fmt.Errorf("want a unit ms, s, m, h or d, got %q", s)
	}
	if count > int64(MaxPeriod/unit) {
		return 0, errors.New("must be at most 366d")
	}
	return time.Duration(count) * unit, nil
}
