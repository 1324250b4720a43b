package crdt

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Limits of an encoded batch. [AppendBatch] does not check them; a batch
// beyond them encodes but does not decode, so the caller splits larger
// batches and refuses longer keys and region names.
const (
	MaxBatch  = 1 << 16 // deltas in one batch
	MaxString = 4096    // bytes in one key or region name
)

// batchVersion is the first byte of every batch.
const batchVersion = 1

// Errors returned by [DecodeBatch], wrapped with detail.
var (
	// ErrMalformed: the input is not a valid batch (truncated, trailing
	// bytes, an index or count out of range, a limit exceeded).
	ErrMalformed = errors.New("crdt: malformed delta batch")
	// ErrVersion: the batch's version byte is not one this package knows.
	ErrVersion = errors.New("crdt: unsupported delta batch version")
)

// AppendBatch appends the encoding of ds to dst and returns the extended
// slice. The format is:
//
//	version byte (1)
//	uvarint string count, then each string as uvarint length and bytes
//	uvarint delta count, then for each delta:
//	  uvarint key index, uvarint origin index (into the string table),
//	  varint window − previous window, varint seq − previous seq
//	  (the previous values are 0 for the first delta), uvarint value
//
// Each key and origin is written once, so deltas cost a few bytes each once
// their strings are in the table. An empty ds encodes to three bytes.
func AppendBatch(dst []byte, ds []Delta) []byte {
	index := make(map[string]uint64, len(ds))
	var table []string
	for _, d := range ds {
		for _, s := range [2]string{d.Origin, d.Key} {
			if _, ok := index[s]; !ok {
				index[s] = uint64(len(table))
				table = append(table, s)
			}
		}
	}
	dst = append(dst, batchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(table)))
	for _, s := range table {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(ds)))
	var window, seq uint64
	for _, d := range ds {
		dst = binary.AppendUvarint(dst, index[d.Key])
		dst = binary.AppendUvarint(dst, index[d.Origin])
		dst = binary.AppendVarint(dst, int64(d.Window-window))
		dst = binary.AppendVarint(dst, int64(d.Seq-seq))
		dst = binary.AppendUvarint(dst, d.Value)
		window, seq = d.Window, d.Seq
	}
	return dst
}

// DecodeBatch decodes a batch written by [AppendBatch]. It returns an error
// wrapping [ErrMalformed] or [ErrVersion] for input it cannot decode; it
// never panics, and what it allocates is proportional to the input length. An
// empty batch decodes to nil.
func DecodeBatch(b []byte) ([]Delta, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("empty input: %w", ErrMalformed)
	}
	if b[0] != batchVersion {
		return nil, fmt.Errorf("version %d: %w", b[0], ErrVersion)
	}
	r := reader{b: b[1:]}
	// Every string takes at least 1 byte and every delta at least 5.
	table := make([]string, r.count("string count", 2*MaxBatch, 1))
	for i := range table {
		n := r.count("string length", MaxString, 1)
		if r.err != nil {
			break
		}
		table[i] = string(r.b[:n])
		r.b = r.b[n:]
	}
	n := r.count("delta count", MaxBatch, 5)
	if r.err != nil || n == 0 {
		return nil, r.finish()
	}
	ds := make([]Delta, n)
	var window, seq uint64
	for i := range ds {
		key, origin := r.index(table), r.index(table)
		window += uint64(r.varint())
		seq += uint64(r.varint())
		ds[i] = Delta{Key: key, Window: window, Origin: origin, Seq: seq, Value: r.uvarint()}
	}
	if err := r.finish(); err != nil {
		return nil, err
	}
	return ds, nil
}

// reader decodes varints from b; the first error sticks and later reads
// return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format+": %w", append(args, ErrMalformed)...)
	}
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong uvarint, %d bytes left", len(r.b))
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong varint, %d bytes left", len(r.b))
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count of items of at least size bytes each, at most max,
// and refuses counts the rest of the input cannot hold.
func (r *reader) count(what string, max, size int) int {
	v := r.uvarint()
	if v > uint64(max) || v > uint64(len(r.b)/size) {
		r.fail("%s %d exceeds limit or remaining input", what, v)
		return 0
	}
	return int(v)
}

func (r *reader) index(table []string) string {
	i := r.uvarint()
	if i >= uint64(len(table)) {
		r.fail("string index %d out of range [0, %d)", i, len(table))
		return ""
	}
	return table[i]
}

// finish returns the first error, or one for unread trailing bytes.
func (r *reader) finish() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	return r.err
}
