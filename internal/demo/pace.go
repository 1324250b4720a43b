package demo

import "time"

// pacer turns a rate into whole requests, tick after tick, carrying the
// fraction over so that a rate of 0.5/s on 50 ms ticks sends one request
// every 20 ticks. The zero value is ready. Not safe for concurrent use.
type pacer struct {
	carry float64
}

// take returns how many requests are due for rate (per second) over dt.
// A rate change takes effect at once; a zero rate drops the carry.
func (p *pacer) take(rate float64, dt time.Duration) int {
	if rate <= 0 || dt <= 0 {
		p.carry = 0
		return 0
	}
	due := p.carry + rate*dt.Seconds()
	n := int(due)
	p.carry = due - float64(n)
	return n
}
