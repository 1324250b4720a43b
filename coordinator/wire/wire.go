// Package wire converts the coordinator's messages (package coordinator)
// to and from their protobuf form (allot.v1.Coordinator), for the edges on
// both sides of the stream.
package wire

import (
	"fmt"
	"math"

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
	return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Ack{Ack: &allotv1.AssignmentAck{Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version}}}
}

// Assignment converts an assignment for the wire.
func Assignment(a coordinator.Assignment) *allotv1.CoordinatorMessage {
	pa := &allotv1.ShareAssignment{Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version}
	for _, s := range a.Shares {
		pa.Shares = append(pa.Shares, &allotv1.Share{Limit: s.Limit, Key: s.Key, Value: s.Value})
	}
	return &allotv1.CoordinatorMessage{Msg: &allotv1.CoordinatorMessage_Assignment{Assignment: pa}}
}

// FromAssignment converts an assignment from the wire.
func FromAssignment(pa *allotv1.ShareAssignment) coordinator.Assignment {
	a := coordinator.Assignment{Domain: pa.GetDomain(), Region: pa.GetRegion(), Term: pa.GetTerm(), Version: pa.GetVersion()}
	for _, s := range pa.GetShares() {
		a.Shares = append(a.Shares, coordinator.Share{Limit: s.GetLimit(), Key: s.GetKey(), Value: s.GetValue()})
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
		return coordinator.Ack{Domain: domain, Region: region, Term: a.GetTerm(), Version: a.GetVersion()}, nil
	}
	return nil, fmt.Errorf("a message that is neither a report nor an ack")
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
