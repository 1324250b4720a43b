package peersync

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/crdt"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// Errors of this package's own checks of what peers send.
var (
	// ErrNoHello is returned for a stream whose first message has no
	// hello.
	ErrNoHello = errors.New("peersync: stream does not start with a hello")
	// ErrWrongOrigin is returned for a batch with a delta of another
	// region than the stream's.
	ErrWrongOrigin = errors.New("peersync: delta of another region")
)

// encodeBatch converts a batch for the wire.
func encodeBatch(b regional.Batch) *allotv1.DeltaBatch {
	return &allotv1.DeltaBatch{Domain: b.Domain, Limit: b.Limit, Deltas: crdt.AppendBatch(nil, b.Deltas), Full: b.Full, Seq: b.Seq}
}

// decodeBatch converts a batch from the wire, sent by region origin. Its
// errors wrap crdt.ErrMalformed, crdt.ErrVersion or ErrWrongOrigin.
func decodeBatch(origin string, db *allotv1.DeltaBatch) (regional.Batch, error) {
	ds, err := crdt.DecodeBatch(db.GetDeltas())
	if err != nil {
		return regional.Batch{}, fmt.Errorf("batch of %s/%s: %w", db.GetDomain(), db.GetLimit(), err)
	}
	for _, d := range ds {
		if d.Origin != origin {
			return regional.Batch{}, fmt.Errorf("%w: batch of %s/%s carries region %q's slot on a stream from %q",
				ErrWrongOrigin, db.GetDomain(), db.GetLimit(), d.Origin, origin)
		}
	}
	return regional.Batch{Domain: db.GetDomain(), Limit: db.GetLimit(), Deltas: ds, Full: db.GetFull(), Seq: db.GetSeq()}, nil
}

// DecodeMessage decodes the batches of a message sent by region origin,
// as the receiving side of a stream does. It is exported for the fuzz
// test and for tools; it never panics.
func DecodeMessage(origin string, m *allotv1.SyncMessage) ([]regional.Batch, error) {
	out := make([]regional.Batch, 0, len(m.GetBatches()))
	for _, db := range m.GetBatches() {
		b, err := decodeBatch(origin, db)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// errorTable maps errors to gRPC codes and metric reasons; first match
// wins. fatal errors end a Sync stream, the others are rejections.
var errorTable = []struct {
	err    error
	code   codes.Code
	reason string
	fatal  bool
}{
	// Over TLS, a caller whose certificate is not the region (and
	// instance) it declares, or not an enforcer's (internal/tlsx).
	{tlsx.ErrIdentity, codes.PermissionDenied, "identity", true},
	{tlsx.ErrNoIdentity, codes.PermissionDenied, "identity", true},
	{tlsx.ErrNoClientCert, codes.PermissionDenied, "identity", true},
	{ErrNoHello, codes.InvalidArgument, "no_hello", true},
	{ErrWrongOrigin, codes.InvalidArgument, "wrong_origin", true},
	{crdt.ErrMalformed, codes.InvalidArgument, "malformed", true},
	{crdt.ErrVersion, codes.InvalidArgument, "malformed", true},
	{regional.ErrUnknownPeer, codes.PermissionDenied, "unknown_region", true},
	{regional.ErrNoPeers, codes.FailedPrecondition, "no_peers", true},
	{regional.ErrUnknownDomain, codes.NotFound, "unknown_domain", false},
	{regional.ErrUnknownLimit, codes.NotFound, "unknown_limit", false},
	{regional.ErrNotShared, codes.FailedPrecondition, "not_shared", false},
	{regional.ErrNotLendable, codes.FailedPrecondition, "not_lendable", false},
	{regional.ErrBadDescriptor, codes.InvalidArgument, "bad_key", false},
	{regional.ErrBadCost, codes.InvalidArgument, "bad_amount", false},
	{regional.ErrBadDelta, codes.InvalidArgument, "bad_window", false},
}

// classify returns err's code, reason and whether it ends a stream.
func classify(err error) (codes.Code, string, bool) {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.code, e.reason, e.fatal
		}
	}
	return codes.Internal, "internal", true
}

func grpcError(err error) error {
	code, _, _ := classify(err)
	return status.Error(code, err.Error())
}
