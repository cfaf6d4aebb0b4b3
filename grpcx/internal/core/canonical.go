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
func sortFields(b []byte, md protoreflect.MessageDescriptor) {
	sorted := true
	var prev protowire.Number
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return
		}
		if sub := subMessage(md, num, typ); sub != nil {
			v := b[i+n : i+n+m]
			if typ == protowire.BytesType {
				_, k := protowire.ConsumeVarint(v)
				v = v[k:]
			} else {
				v = v[:len(v)-protowire.SizeTag(num)] // the group's end tag
			}
			sortFields(v, sub)
		}
		if num < prev {
			sorted = false
		}
		prev = max(prev, num)
		i += n + m
	}
	if sorted {
		return
	}
	type field struct {
		num        protowire.Number
		start, end int
	}
	var small [16]field
	fields := small[:0]
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		fields = append(fields, field{num, i, i + n + m})
		i += n + m
	}
	slices.SortStableFunc(fields, func(x, y field) int { return int(x.num) - int(y.num) })
	out := make([]byte, 0, len(b))
	for _, f := range fields {
		out = append(out, b[f.start:f.end]...)
	}
	copy(b, out)
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
