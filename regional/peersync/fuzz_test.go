package peersync_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/crdt"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional/peersync"
)

// FuzzDecodeMessage feeds the decoder of what peers send with arbitrary
// bytes: it must never panic, and what it accepts must re-encode to the
// same deltas, all of the stream's region.
func FuzzDecodeMessage(f *testing.F) {
	ds := []crdt.Delta{
		{Key: "user=1", Window: 4_250_000_000, Origin: "b", Seq: 7, Value: 12},
		{Key: "user=2", Window: 4_250_000_000, Origin: "b", Seq: 8, Value: 3},
	}
	for _, m := range []*allotv1.SyncMessage{
		{Hello: &allotv1.SyncHello{Region: "b", Instance: "1"}},
		{SentUnixNano: 1, Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: crdt.AppendBatch(nil, ds)}}},
		{Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: crdt.AppendBatch(nil, nil), Seq: 9}}},
		{Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: crdt.AppendBatch(nil, ds), Full: true, Seq: 8}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m allotv1.SyncMessage
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		bs, err := peersync.DecodeMessage("b", &m)
		if err != nil {
			return
		}
		for i, b := range bs {
			for _, d := range b.Deltas {
				if d.Origin != "b" {
					t.Fatalf("accepted a delta of %q", d.Origin)
				}
			}
			again, err := crdt.DecodeBatch(crdt.AppendBatch(nil, b.Deltas))
			if err != nil || !slices.Equal(again, b.Deltas) {
				t.Fatalf("batch %d does not round-trip: %v", i, err)
			}
		}
	})
}
