package coordinator

import (
	"testing"
	"time"
)

// TestClockSync: an instance whose clock reads 500ms behind the
// coordinator's learns the offset from its reports' echoes within the
// error bound, whatever the asymmetry of the two ways; the samples'
// bounds overlap where the offset is (a fast way up from one sample and
// a fast way down from another bound it closer than either), the error
// grows with age, a sample whose bound misses the newer ones' is not
// taken, and contradicting echoes are ignored.
func TestClockSync(t *testing.T) {
	const behind = 500 * time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	local := func(coord time.Time) time.Time { return coord.Add(-behind) }
	var c ClockSync
	if _, _, ok := c.Offset(t0); ok {
		t.Fatal("an offset before any sample")
	}
	// A report leaves at coordinator time at, takes up ms to arrive, is
	// held for hold and its echo takes down to come back.
	exchange := func(at time.Time, up, hold, down time.Duration) (time.Time, ClockEcho) {
		e := ClockEcho{ReportAt: local(at), Received: at.Add(up), Sent: at.Add(up + hold)}
		return local(at.Add(up + hold + down)), e
	}
	rows := []struct {
		up, hold, down time.Duration
		wantErr        time.Duration // of the estimate after this sample
	}{
		{90 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond},
		{30 * time.Millisecond, 200 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond}, // held long: the hold is not error; with the first, [−10ms, +30ms]
		{100 * time.Millisecond, 0, 100 * time.Millisecond, 20 * time.Millisecond},                    // a wider bound: the overlap stays
	}
	at := t0
	for i, r := range rows {
		now, e := exchange(at, r.up, r.hold, r.down)
		if !c.Sample(now, e) {
			t.Fatalf("row %d: sample refused", i)
		}
		off, err, ok := c.Offset(now)
		if !ok {
			t.Fatalf("row %d: no offset", i)
		}
		if d := off - behind; d > err || -d > err {
			t.Fatalf("row %d: offset %v, true %v, off by more than its error %v", i, off, behind, err)
		}
		if err.Round(time.Millisecond) != r.wantErr {
			t.Fatalf("row %d: error %v, want %v", i, err, r.wantErr)
		}
		at = at.Add(time.Second)
	}
	// An hour later every sample is too old.
	if _, _, ok := c.Offset(local(at.Add(time.Hour))); ok {
		t.Fatal("an offset from samples an hour old")
	}
	// A minute later the error has grown by the drift of a minute.
	_, err, _ := c.Offset(local(at.Add(time.Minute)))
	if want := 20*time.Millisecond + time.Duration(float64(62*time.Second)*ClockDrift); err < want-time.Millisecond || err > want+time.Millisecond {
		t.Fatalf("error a minute later %v, want about %v", err, want)
	}
	// The clock is set 300ms forward: the next sample's bound misses the
	// older ones', which are not taken with it.
	stepped := func(coord time.Time) time.Time { return local(coord).Add(300 * time.Millisecond) }
	{
		at := at.Add(2 * time.Minute)
		e := ClockEcho{ReportAt: stepped(at), Received: at.Add(20 * time.Millisecond), Sent: at.Add(20 * time.Millisecond)}
		c := c
		now := stepped(at.Add(40 * time.Millisecond))
		if !c.Sample(now, e) {
			t.Fatal("sample after the step refused")
		}
		off, err, _ := c.Offset(now)
		if d := off - (behind - 300*time.Millisecond); d > err || -d > err || err.Round(time.Millisecond) != 20*time.Millisecond {
			t.Fatalf("after the step: offset %v ± %v, true %v", off, err, behind-300*time.Millisecond)
		}
	}
	// Echoes that contradict themselves change nothing.
	before := c
	now, e := exchange(at, 10*time.Millisecond, 0, 10*time.Millisecond)
	e.Sent = e.Received.Add(-time.Millisecond) // sent before it was received
	if c.Sample(now, e) || c != before {
		t.Fatal("an echo sent before it was received was used")
	}
	if c.Sample(e.ReportAt.Add(-time.Millisecond), ClockEcho{ReportAt: e.ReportAt, Received: e.Received, Sent: e.Received}) || c != before {
		t.Fatal("an answer received before its report left was used")
	}
}
