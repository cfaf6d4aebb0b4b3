package core

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// MD is metadata: lower-case names to values, as grpc's metadata.MD (and
// Connect's headers, lower-cased).
type MD = map[string][]string

// errCorruptRecord: a stored result decodeRecord cannot read.
var errCorruptRecord = errors.New("idemguard: stored gRPC response is corrupt")

// recordVersion is the first byte of every stored call.
const recordVersion = 1

// Why a stored call carries no response message (field notKept).
const (
	notKeptTooLarge = 1 // the response was over Options.MaxStoredResponse bytes
	notKeptNotProto = 2 // the response was not a proto.Message
)

// Field numbers of a stored call, after the version byte. The fields are
// protobuf wire format, so a later version can add some and still read
// today's records.
const (
	fieldType     = 1 // string: the response message's full name
	fieldMessage  = 2 // bytes: its deterministic encoding
	fieldStatus   = 3 // bytes: a google.rpc.Status, for an error the handler returned
	fieldHeader   = 4 // message {1: name, 2: value}, one per value
	fieldTrailer  = 5 // message {1: name, 2: value}, one per value
	fieldNotKept  = 6 // varint: why no message was kept
	fieldMDName   = 1
	fieldMDValues = 2
)

// storedCall is what the interceptor keeps of a completed call: the
// response message, or the status of the error the handler returned, and
// the header and trailer metadata it set (already filtered).
type storedCall struct {
	typeName string // the response message's full name; "" with status
	message  []byte
	status   []byte // a marshalled google.rpc.Status; nil on success
	header   MD
	trailer  MD
	notKept  uint64
}

// encodeRecord writes c, names in sorted order so that equal calls encode
// equally.
func encodeRecord(c storedCall) []byte {
	size := 1 + len(c.typeName) + len(c.message) + len(c.status) + 32 + mdSize(c.header) + mdSize(c.trailer)
	b := make([]byte, 1, size)
	b[0] = recordVersion
	if c.typeName != "" {
		b = protowire.AppendTag(b, fieldType, protowire.BytesType)
		b = protowire.AppendString(b, c.typeName)
	}
	if c.message != nil {
		b = protowire.AppendTag(b, fieldMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, c.message)
	}
	if c.status != nil {
		b = protowire.AppendTag(b, fieldStatus, protowire.BytesType)
		b = protowire.AppendBytes(b, c.status)
	}
	b = appendMD(b, fieldHeader, c.header)
	b = appendMD(b, fieldTrailer, c.trailer)
	if c.notKept != 0 {
		b = protowire.AppendTag(b, fieldNotKept, protowire.VarintType)
		b = protowire.AppendVarint(b, c.notKept)
	}
	return b
}

func mdSize(md MD) int {
	n := 0
	for k, vs := range md {
		for _, v := range vs {
			n += len(k) + len(v) + 8
		}
	}
	return n
}

func appendMD(b []byte, field protowire.Number, md MD) []byte {
	names := make([]string, 0, len(md))
	for k := range md {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range md[k] {
			b = protowire.AppendTag(b, field, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(protowire.SizeTag(fieldMDName)+protowire.SizeBytes(len(k))+
				protowire.SizeTag(fieldMDValues)+protowire.SizeBytes(len(v))))
			b = protowire.AppendTag(b, fieldMDName, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, fieldMDValues, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	return b
}

// decodeRecord reads what encodeRecord wrote. Unknown fields are skipped.
func decodeRecord(b []byte) (storedCall, error) {
	var c storedCall
	if len(b) == 0 || b[0] != recordVersion {
		return c, fmt.Errorf("%w: not a version %d record", errCorruptRecord, recordVersion)
	}
	b = b[1:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return c, fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldNotKept && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return c, fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
			}
			c.notKept, b = v, b[n:]
			continue
		case typ != protowire.BytesType:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return c, fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return c, fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
		}
		b = b[n:]
		switch num {
		case fieldType:
			c.typeName = string(v)
		case fieldMessage:
			c.message = slices.Clip(v)
		case fieldStatus:
			c.status = slices.Clip(v)
		case fieldHeader, fieldTrailer:
			k, val, err := decodeMDEntry(v)
			if err != nil {
				return c, err
			}
			md := &c.header
			if num == fieldTrailer {
				md = &c.trailer
			}
			if *md == nil {
				*md = MD{}
			}
			(*md)[k] = append((*md)[k], val)
		}
	}
	if c.message == nil && c.status == nil && c.notKept == 0 && c.typeName != "" {
		c.message = []byte{} // an empty message encodes as no bytes
	}
	return c, nil
}

func decodeMDEntry(b []byte) (name, value string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", "", fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", "", fmt.Errorf("%w: %w", errCorruptRecord, protowire.ParseError(n))
		}
		b = b[n:]
		switch num {
		case fieldMDName:
			name = string(v)
		case fieldMDValues:
			value = string(v)
		}
	}
	if name == "" {
		return "", "", fmt.Errorf("%w: metadata entry without a name", errCorruptRecord)
	}
	return name, value, nil
}
