// Package fporacle holds what the fingerprint tests of grpcx and
// grpcx/connectx share: an oracle of the previous release's fingerprint,
// written again here and not taken from the production code, so that a
// change there cannot move the oracle with it. Only tests import it.
package fporacle

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"google.golang.org/protobuf/proto"
)

// Previous is DefaultFingerprint as the release before field order
// computed it for a request without Anys: SHA-256 over the length-prefixed
// full name and the deterministic encoding (fields as Go writes them:
// unknown fields last). It has Options.Fingerprint's signature.
func Previous(_ string, req any) (string, error) {
	m := req.(proto.Message)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	name := m.ProtoReflect().Descriptor().FullName()
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(name))))
	h.Write([]byte(name))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}
