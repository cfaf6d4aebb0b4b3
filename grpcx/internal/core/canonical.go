package core

import (
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// sortFields puts, in place, the fields of b, an encoding of a message of
// type md, in field-number order, and those of every sub-message md's
// schema knows (message and group fields, map entries, extensions linked
// into the program) likewise, at any depth. The order is stable: the
// elements of a repeated field, and any two occurrences of one number,
// keep theirs. An unknown field's bytes are left as they are.
//
// A server's encoding of a decoded message is not a function of the bytes
// the client sent but of the server's schema too: Go writes extensions
// first, oneof members after the other fields, and unknown fields last,
// so a field that one server knows and another does not (a rolling deploy
// of a newer .proto) is written at another place by each. In number order
// the place is the same. Reordering fields of different numbers changes
// no message (decoding is independent of their order) except two members
// of one oneof that the schema does not know, sent in one message, of
// which the last wins: no generated code sends two (docs/design.md,
// section 11, "gRPC fingerprints").
//
// The result has b's length (it is a permutation of b's fields), so it is
// written over b. A level it cannot read to its end keeps its order (the
// levels inside it read before may be sorted); proto.Marshal's output is
// always readable.
//
// The sorted encoding is written once into a buffer of b's length, each
// level's fields in their order as they are written, not each level sorted
// in place after the levels inside it: that copied every level whole, and
// a request nested thousands of levels deep, out of order at each, cost
// the square of its size (docs/design.md, section 11).
func sortFields(b []byte, md protoreflect.MessageDescriptor) {
	if !inOrder(b, md) {
		copy(b, appendSorted(make([]byte, 0, len(b)), b, md))
	}
}

// inOrder reports whether b, an encoding of a message of type md, has its
// fields in number order at every depth sortFields would sort: then it
// leaves b as it is, without a copy (most requests: Go writes known
// fields in number order).
func inOrder(b []byte, md protoreflect.MessageDescriptor) bool {
	var prev protowire.Number
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return true // as far as it reads; the rest stays as it is
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return true
		}
		if num < prev {
			return false
		}
		prev = num
		if sub := subMessage(md, num, typ); sub != nil {
			v := b[i+n : i+n+m]
			if typ == protowire.BytesType {
				_, k := protowire.ConsumeVarint(v)
				v = v[k:]
			} else {
				v = v[:len(v)-protowire.SizeTag(num)] // the group's end tag
			}
			if !inOrder(v, sub) {
				return false
			}
		}
		i += n + m
	}
	return true
}

// appendSorted appends b, an encoding of a message of type md, to dst with
// its fields put in number order at every depth the schema knows, as
// sortFields says.
func appendSorted(dst, b []byte, md protoreflect.MessageDescriptor) []byte {
	type field struct {
		num protowire.Number
		// b[start:end] is the field; b[vstart:vend] the encoding of its
		// sub-message when sub is not nil (after the length, before a
		// group's end tag).
		start, vstart, vend, end int
		sub                      protoreflect.MessageDescriptor
	}
	var small [16]field
	fields := small[:0]
	sorted := true
	i := 0
	for i < len(b) {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			break
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			break
		}
		f := field{num: num, start: i, vstart: i + n + m, vend: i + n + m, end: i + n + m}
		if f.sub = subMessage(md, num, typ); f.sub != nil {
			f.vstart, f.vend = i+n, i+n+m
			if typ == protowire.BytesType {
				_, k := protowire.ConsumeVarint(b[i+n:])
				f.vstart += k
			} else {
				f.vend -= protowire.SizeTag(num) // the group's end tag
			}
		}
		if len(fields) > 0 && num < fields[len(fields)-1].num {
			sorted = false
		}
		fields = append(fields, f)
		i += n + m
	}
	if i == len(b) && !sorted {
		slices.SortStableFunc(fields, func(x, y field) int { return int(x.num) - int(y.num) })
	}
	for _, f := range fields {
		dst = append(dst, b[f.start:f.vstart]...)
		if f.sub != nil {
			dst = appendSorted(dst, b[f.vstart:f.vend], f.sub)
		}
		dst = append(dst, b[f.vend:f.end]...)
	}
	return append(dst, b[i:]...) // what it could not read, as it was
}

// subMessage is the type of field num of md when the schema knows it as a
// message (or group, or map entry) encoded with typ; nil otherwise.
func subMessage(md protoreflect.MessageDescriptor, num protowire.Number, typ protowire.Type) protoreflect.MessageDescriptor {
	if typ != protowire.BytesType && typ != protowire.StartGroupType {
		return nil
	}
	fd := md.Fields().ByNumber(num)
	if fd == nil {
		if !md.ExtensionRanges().Has(num) {
			return nil
		}
		xt, err := protoregistry.GlobalTypes.FindExtensionByNumber(md.FullName(), num)
		if err != nil {
			return nil
		}
		fd = xt.TypeDescriptor()
	}
	switch {
	case fd.Kind() == protoreflect.MessageKind && typ == protowire.BytesType,
		fd.Kind() == protoreflect.GroupKind && typ == protowire.StartGroupType:
		return fd.Message()
	}
	return nil
}
