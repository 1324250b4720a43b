// Package wirejson writes protobuf messages as JSON for people and
// scripts: the proto3 JSON mapping with the .proto field names, except
// that 64-bit integers are JSON numbers, not strings ("limit": 30, not
// "limit": "30"), and that the float fields Options.Round names are
// rounded for display. Well-known types keep the proto3 mapping: a
// google.protobuf.Duration is a string of seconds ("1.500s"), a Timestamp
// an RFC 3339 string.
//
// Every integer allot sends is below 2^53 (amounts are at most
// allot.MaxAmount, 2^50), so a JavaScript reader loses nothing.
package wirejson

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Options configure Marshal.
type Options struct {
	// Indent, when set, writes one field a line, indented by it per level
	// (protojson's Multiline); empty writes one line.
	Indent string
	// EmitUnpopulated writes fields that hold their zero value (null for
	// an unset message), as protojson's option of that name: unset oneof
	// members and proto3 optional fields are still left out.
	EmitUnpopulated bool
	// Round rounds the float and double fields of these names (the
	// values, for a map or a list) to that many decimals.
	Round map[string]int
}

// ShareDigits is how many decimals a share is shown with: shares travel
// as float32 (0.3 arrives as 0.29999998211860657), which four decimals
// hide without hiding a real difference.
const ShareDigits = 4

// Shares rounds the fields named share and shares (a map of region →
// share) to ShareDigits decimals.
var Shares = map[string]int{"share": ShareDigits, "shares": ShareDigits}

// Marshal writes m as JSON.
func Marshal(m proto.Message, o Options) ([]byte, error) {
	e := encoder{o: o}
	if err := e.message(m.ProtoReflect()); err != nil {
		return nil, err
	}
	if o.Indent == "" {
		return e.buf.Bytes(), nil
	}
	var out bytes.Buffer
	if err := json.Indent(&out, e.buf.Bytes(), "", o.Indent); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Round rounds x to digits decimals.
func Round(x float64, digits int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	p := math.Pow10(digits)
	if r := math.Round(x*p) / p; !math.IsInf(r, 0) && !math.IsNaN(r) {
		return r
	}
	return x // too large to scale: no decimals to round
}

type encoder struct {
	o   Options
	buf bytes.Buffer
}

func (e *encoder) message(m protoreflect.Message) error {
	if strings.HasPrefix(string(m.Descriptor().FullName()), "google.protobuf.") {
		b, err := protojson.Marshal(m.Interface())
		if err != nil {
			return err
		}
		e.buf.Write(b)
		return nil
	}
	e.buf.WriteByte('{')
	fields := m.Descriptor().Fields()
	first := true
	for i := range fields.Len() {
		fd := fields.Get(i)
		has := m.Has(fd)
		if !has && (!e.o.EmitUnpopulated || fd.ContainingOneof() != nil) {
			continue
		}
		if !first {
			e.buf.WriteByte(',')
		}
		first = false
		e.str(string(fd.Name()))
		e.buf.WriteByte(':')
		if err := e.field(fd, m.Get(fd), has); err != nil {
			return err
		}
	}
	e.buf.WriteByte('}')
	return nil
}

func (e *encoder) field(fd protoreflect.FieldDescriptor, v protoreflect.Value, has bool) error {
	switch {
	case fd.IsList():
		l := v.List()
		e.buf.WriteByte('[')
		for i := range l.Len() {
			if i > 0 {
				e.buf.WriteByte(',')
			}
			if err := e.single(string(fd.Name()), fd, l.Get(i)); err != nil {
				return err
			}
		}
		e.buf.WriteByte(']')
		return nil
	case fd.IsMap():
		mp := v.Map()
		keys := make([]protoreflect.MapKey, 0, mp.Len())
		mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			keys = append(keys, k)
			return true
		})
		slices.SortFunc(keys, func(a, b protoreflect.MapKey) int { return strings.Compare(a.String(), b.String()) })
		e.buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				e.buf.WriteByte(',')
			}
			e.str(k.String())
			e.buf.WriteByte(':')
			if err := e.single(string(fd.Name()), fd.MapValue(), mp.Get(k)); err != nil {
				return err
			}
		}
		e.buf.WriteByte('}')
		return nil
	case !has && fd.Message() != nil:
		e.buf.WriteString("null")
		return nil
	}
	return e.single(string(fd.Name()), fd, v)
}

// single writes one value of fd's kind; name is the field's (a map
// value's is its map field's), for Round.
func (e *encoder) single(name string, fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		e.buf.WriteString(strconv.FormatBool(v.Bool()))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		e.buf.WriteString(strconv.FormatInt(v.Int(), 10))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		e.buf.WriteString(strconv.FormatUint(v.Uint(), 10))
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		e.float(name, v.Float(), fd.Kind() == protoreflect.FloatKind)
	case protoreflect.StringKind:
		e.str(v.String())
	case protoreflect.BytesKind:
		e.str(base64.StdEncoding.EncodeToString(v.Bytes()))
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			e.str(string(ev.Name()))
		} else {
			e.buf.WriteString(strconv.FormatInt(int64(v.Enum()), 10))
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return e.message(v.Message())
	}
	return nil
}

func (e *encoder) float(name string, f float64, is32 bool) {
	switch {
	case math.IsNaN(f):
		e.buf.WriteString(`"NaN"`)
		return
	case math.IsInf(f, 1):
		e.buf.WriteString(`"Infinity"`)
		return
	case math.IsInf(f, -1):
		e.buf.WriteString(`"-Infinity"`)
		return
	}
	if d, ok := e.o.Round[name]; ok {
		f = Round(f, d)
		is32 = false // rounded: its shortest form is the rounded decimal
	}
	var b []byte
	if is32 {
		b, _ = json.Marshal(float32(f))
	} else {
		b, _ = json.Marshal(f)
	}
	e.buf.Write(b)
}

// str writes s as a JSON string, with <, > and & as they are.
func (e *encoder) str(s string) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	e.buf.Write(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}
