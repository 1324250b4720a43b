package demo

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	const tick = 50 * time.Millisecond
	sum := func(p *pacer, rate float64, ticks int) int {
		n := 0
		for range ticks {
			n += p.take(rate, tick)
		}
		return n
	}
	var p pacer
	if n := sum(&p, 30, 20); n != 30 {
		t.Errorf("30/s for 1s: %d requests, want 30", n)
	}
	if n := sum(&p, 0.5, 39); n != 0 {
		t.Errorf("0.5/s for 1.95s: %d requests, want 0", n)
	}
	if n := p.take(0.5, tick); n != 1 {
		t.Errorf("0.5/s at 2s: %d requests, want 1", n)
	}
	if n := sum(&p, 7, 200); n != 70 {
		t.Errorf("7/s for 10s: %d requests, want 70", n)
	}
	p.take(0.5, 1900*time.Millisecond) // a carry of 0.95
	if n := p.take(0, tick); n != 0 || p.carry != 0 {
		t.Errorf("rate 0: %d requests, carry %v; want 0 and no carry", n, p.carry)
	}
	if n := p.take(10, 0); n != 0 {
		t.Errorf("no time: %d requests, want 0", n)
	}
}
