package crdt

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

var deltaGen = rapid.Custom(func(t *rapid.T) Delta {
	str := rapid.OneOf(keyGen, regionGen, rapid.StringN(0, 40, MaxString))
	num := rapid.OneOf(rapid.Uint64Max(1000), rapid.Uint64())
	return Delta{
		Key:    str.Draw(t, "key"),
		Window: num.Draw(t, "window"),
		Origin: str.Draw(t, "origin"),
		Seq:    num.Draw(t, "seq"),
		Value:  num.Draw(t, "value"),
	}
})

func TestBatchRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ds := rapid.SliceOfN(deltaGen, 0, 100).Draw(t, "deltas")
		prefix := []byte("prefix")
		b := AppendBatch(slices.Clone(prefix), ds)
		if !bytes.HasPrefix(b, prefix) {
			t.Fatalf("AppendBatch overwrote dst")
		}
		got, err := DecodeBatch(b[len(prefix):])
		if err != nil {
			t.Fatalf("DecodeBatch: %v", err)
		}
		if !slices.Equal(got, ds) {
			t.Fatalf("decoded %v, want %v", got, ds)
		}
	})
}

func TestBatchInternsStrings(t *testing.T) {
	s := NewStore("us-east", 0)
	for range 100 {
		s.Inc("tenant=acme", 7, 1)
		s.Inc("tenant=acme", 8, 1)
		s.DeltasSince(0)
	}
	ds, _ := s.DeltasSince(0)
	b := AppendBatch(nil, ds)
	if n := bytes.Count(b, []byte("us-east")); n != 1 {
		t.Errorf("origin written %d times, want 1", n)
	}
	if n := bytes.Count(b, []byte("tenant=acme")); n != 1 {
		t.Errorf("key written %d times, want 1", n)
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	valid := AppendBatch(nil, []Delta{{Key: "k", Window: 5, Origin: "o", Seq: 1, Value: 3}})
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"unknown version", []byte{2, 0, 0}, ErrVersion},
		{"no counts", []byte{1}, ErrMalformed},
		{"truncated", valid[:len(valid)-1], ErrMalformed},
		{"trailing bytes", append(slices.Clone(valid), 0), ErrMalformed},
		{"overlong varint", []byte{1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, ErrMalformed},
		{"string count beyond input", []byte{1, 100, 1, 'a'}, ErrMalformed},
		{"string beyond input", []byte{1, 1, 5, 'a', 'b'}, ErrMalformed},
		{"string too long", append([]byte{1, 1, 0x81, 0x20}, make([]byte, MaxString+1)...), ErrMalformed},
		{"delta count beyond input", []byte{1, 0, 2, 0, 0, 0, 0, 0}, ErrMalformed},
		{"delta count too big", append([]byte{1, 1, 0, 0x81, 0x80, 0x04}, make([]byte, 5*(MaxBatch+1))...), ErrMalformed},
		{"key index out of range", []byte{1, 1, 0, 1, 1, 0, 0, 0, 0}, ErrMalformed},
		{"origin index out of range", []byte{1, 1, 0, 1, 0, 1, 0, 0, 0}, ErrMalformed},
	}
	for _, tt := range tests {
		ds, err := DecodeBatch(tt.in)
		if !errors.Is(err, tt.want) || ds != nil {
			t.Errorf("%s: DecodeBatch = %v, %v; want nil, %v", tt.name, ds, err, tt.want)
		}
	}
	if ds, err := DecodeBatch(AppendBatch(nil, nil)); err != nil || ds != nil {
		t.Errorf("empty batch: DecodeBatch = %v, %v; want nil, nil", ds, err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, ds := range [][]Delta{
		nil,
		{{Key: "user=42", Window: 29000000, Origin: "us-east", Seq: 1, Value: 7}},
		{
			{Key: "a", Window: 10, Origin: "eu-west", Seq: 100, Value: 1},
			{Key: "b", Window: 9, Origin: "eu-west", Seq: 101, Value: 1 << 40},
			{Key: "a", Window: 1<<64 - 1, Origin: "ap-south", Seq: 0, Value: 0},
		},
	} {
		f.Add(AppendBatch(nil, ds))
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0})
	f.Add([]byte("\x01\x01\x03key\x01\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ds, err := DecodeBatch(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		again, err := DecodeBatch(AppendBatch(nil, ds))
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if !slices.Equal(again, ds) {
			t.Fatalf("re-encoded batch decodes to %v, want %v", again, ds)
		}
	})
}

// benchBatch is 1000 deltas from one region: 500 keys in two windows, as
// DeltasSince returns them.
func benchBatch() []Delta {
	s := NewStore("us-east", 0)
	for i := range 500 {
		key := fmt.Sprintf("tenant=t%d/user=%d", i%50, i)
		s.Inc(key, 29000000, uint64(i%200+1))
		s.Inc(key, 29000001, uint64(i%30+1))
	}
	ds, _ := s.DeltasSince(0)
	return ds
}

func BenchmarkAppendBatch(b *testing.B) {
	ds := benchBatch()
	var buf []byte
	for b.Loop() {
		buf = AppendBatch(buf[:0], ds)
	}
	b.ReportMetric(float64(len(buf))/float64(len(ds)), "bytes/delta")
}

func BenchmarkDecodeBatch(b *testing.B) {
	ds := benchBatch()
	buf := AppendBatch(nil, ds)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := DecodeBatch(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf))/float64(len(ds)), "bytes/delta")
}
