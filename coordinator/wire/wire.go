// Package wire converts the coordinator's messages (package coordinator)
// to and from their protobuf form (allot.v1.Coordinator), for the edges on
// both sides of the stream.
package wire

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot/coordinator"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Report converts a demand report for the wire; non-finite amounts become 0.
func Report(r coordinator.Report) *allotv1.RegionMessage {
	pr := &allotv1.DemandReport{Domain: r.Domain, Region: r.Region, At: timestamppb.New(r.At)}
	for _, l := range r.Limits {
		pl := &allotv1.LimitDemand{Limit: l.Limit, Admitted: finite(l.Admitted), Rejected: finite(l.Rejected)}
		for _, k := range l.Keys {
			pl.Keys = append(pl.Keys, &allotv1.KeyDemand{Key: k.Key, Admitted: finite(k.Admitted), Rejected: finite(k.Rejected), NearLimit: k.NearLimit})
		}
		pr.Limits = append(pr.Limits, pl)
	}
	return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Report{Report: pr}}
}

// Ack converts an ack for the wire.
func Ack(a coordinator.Ack) *allotv1.RegionMessage {
	return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Ack{Ack: &allotv1.AssignmentAck{Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version, GrantSeq: a.Seq, Leaving: a.Leaving,
		Released: movedOut(a.Released), Wanted: movedOut(a.Wanted)}}}
}

// Hello converts an instance's hello (its latest ack and the weights it
// holds) for the wire.
func Hello(a coordinator.Ack, weights []coordinator.Weight) *allotv1.RegionMessage {
	return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Hello{Hello: &allotv1.Hello{
		Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version, Instance: a.Instance, GrantSeq: a.Seq, Weights: weightsOut(weights),
		Leaving: a.Leaving, SentAt: timeOut(a.SentAt)}}}
}

// HelloSentAt is when h says it was sent (Ack.SentAt): the zero time for
// none or one that is not a valid time, which only costs the instance
// its clock's estimate until its first report.
func HelloSentAt(h *allotv1.Hello) time.Time {
	if t := h.GetSentAt(); t != nil && t.IsValid() {
		return t.AsTime()
	}
	return time.Time{}
}

// timeOut converts t for the wire: nil for the zero time.
func timeOut(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func weightsOut(ws []coordinator.Weight) []*allotv1.Weight {
	out := make([]*allotv1.Weight, 0, len(ws))
	for _, w := range ws {
		out = append(out, &allotv1.Weight{Limit: w.Limit, Key: w.Key, Value: w.Value, Rest: w.Rest})
	}
	return out
}

func movedOut(ms []coordinator.Moved) []*allotv1.Moved {
	var out []*allotv1.Moved
	for _, m := range ms {
		out = append(out, &allotv1.Moved{Limit: m.Limit, Key: m.Key, Window: timestamppb.New(m.Window), Value: m.Value})
	}
	return out
}

// fromMoved converts releases or extras from the wire; one without a
// window names none (the zero time), which every receiver ignores.
func fromMoved(ms []*allotv1.Moved) []coordinator.Moved {
	var out []coordinator.Moved
	for _, m := range ms {
		var w time.Time
		if m.GetWindow() != nil {
			w = m.GetWindow().AsTime()
		}
		out = append(out, coordinator.Moved{Limit: m.GetLimit(), Key: m.GetKey(), Window: w, Value: m.GetValue()})
	}
	return out
}

// FromWeights converts weights from the wire.
func FromWeights(ws []*allotv1.Weight) []coordinator.Weight {
	var out []coordinator.Weight
	for _, w := range ws {
		out = append(out, coordinator.Weight{Limit: w.GetLimit(), Key: w.GetKey(), Value: w.GetValue(), Rest: w.GetRest()})
	}
	return out
}

// Assignment converts an assignment for the wire.
func Assignment(a coordinator.Assignment) *allotv1.CoordinatorMessage {
	return AssignmentWith(a, Shares(a.Shares))
}

// Shares converts shares for the wire, once for the many assignments (one
// per instance of a region) that carry the same ones.
func Shares(shares []coordinator.Share) []*allotv1.Share {
	out := make([]*allotv1.Share, 0, len(shares))
	for _, s := range shares {
		ps := &allotv1.Share{Limit: s.Limit, Key: s.Key, Value: s.Value}
		if !s.Since.IsZero() {
			ps.Since = timestamppb.New(s.Since)
		}
		out = append(out, ps)
	}
	return out
}

// AssignmentWith converts an assignment for the wire with its shares
// converted already (Shares); the messages share them, read-only.
func AssignmentWith(a coordinator.Assignment, shares []*allotv1.Share) *allotv1.CoordinatorMessage {
	pa := &allotv1.ShareAssignment{Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version, Instance: a.Instance, Shares: shares}
	if g := a.Grant; g != nil {
		pa.Grant = &allotv1.Grant{Seq: g.Seq, Expires: timestamppb.New(g.Expires), Full: g.Full, Fresh: g.Fresh, Weights: weightsOut(g.Weights),
			Extras: movedOut(g.Extras), Pooled: g.Pooled, PooledKeys: g.PooledKeys}
	}
	if c := a.Clock; c != nil {
		pa.Clock = &allotv1.ClockEcho{ReportAt: timestamppb.New(c.ReportAt), Received: timestamppb.New(c.Received), Sent: timestamppb.New(c.Sent)}
	}
	return &allotv1.CoordinatorMessage{Msg: &allotv1.CoordinatorMessage_Assignment{Assignment: pa}}
}

// FromAssignment converts an assignment from the wire.
func FromAssignment(pa *allotv1.ShareAssignment) coordinator.Assignment {
	a := coordinator.Assignment{Domain: pa.GetDomain(), Region: pa.GetRegion(), Term: pa.GetTerm(), Version: pa.GetVersion(), Instance: pa.GetInstance()}
	if g := pa.GetGrant(); g != nil {
		a.Grant = &coordinator.Grant{Seq: g.GetSeq(), Expires: g.GetExpires().AsTime(), Full: g.GetFull(), Fresh: g.GetFresh(), Weights: FromWeights(g.GetWeights()),
			Extras: fromMoved(g.GetExtras()), Pooled: g.GetPooled(), PooledKeys: g.GetPooledKeys()}
	}
	if c := pa.GetClock(); c != nil && c.GetReportAt() != nil && c.GetReceived() != nil && c.GetSent() != nil {
		a.Clock = &coordinator.ClockEcho{ReportAt: c.GetReportAt().AsTime(), Received: c.GetReceived().AsTime(), Sent: c.GetSent().AsTime()}
	}
	for _, s := range pa.GetShares() {
		sh := coordinator.Share{Limit: s.GetLimit(), Key: s.GetKey(), Value: s.GetValue()}
		if s.GetSince() != nil {
			sh.Since = s.GetSince().AsTime()
		}
		a.Shares = append(a.Shares, sh)
	}
	return a
}

// FromRegion converts a region's report or ack, which must name the
// stream's domain and region.
func FromRegion(domain, region string, m *allotv1.RegionMessage) (coordinator.Message, error) {
	switch {
	case m.GetReport() != nil:
		r := m.GetReport()
		if r.GetDomain() != domain || r.GetRegion() != region {
			return nil, fmt.Errorf("report for %s/%s on the stream of %s/%s", r.GetDomain(), r.GetRegion(), domain, region)
		}
		if r.GetAt() == nil {
			return nil, fmt.Errorf("report without a time")
		}
		rep := coordinator.Report{Domain: domain, Region: region, At: r.GetAt().AsTime()}
		for _, l := range r.GetLimits() {
			ld := coordinator.LimitDemand{Limit: l.GetLimit(), Admitted: l.GetAdmitted(), Rejected: l.GetRejected()}
			for _, k := range l.GetKeys() {
				ld.Keys = append(ld.Keys, coordinator.KeyDemand{Key: k.GetKey(), Admitted: k.GetAdmitted(), Rejected: k.GetRejected(), NearLimit: k.GetNearLimit()})
			}
			rep.Limits = append(rep.Limits, ld)
		}
		return rep, nil
	case m.GetAck() != nil:
		a := m.GetAck()
		if a.GetDomain() != domain || a.GetRegion() != region {
			return nil, fmt.Errorf("ack for %s/%s on the stream of %s/%s", a.GetDomain(), a.GetRegion(), domain, region)
		}
		return coordinator.Ack{Domain: domain, Region: region, Term: a.GetTerm(), Version: a.GetVersion(), Seq: a.GetGrantSeq(), Leaving: a.GetLeaving(),
			Released: fromMoved(a.GetReleased()), Wanted: fromMoved(a.GetWanted())}, nil
	}
	return nil, fmt.Errorf("a message that is neither a report nor an ack")
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
