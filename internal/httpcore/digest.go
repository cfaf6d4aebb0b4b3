package httpcore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"
)

// digester is a SHA-256 with a scratch buffer, reused across requests: a
// fingerprint or computed key then costs one allocation, its string.
// Fields are gathered in buf and hashed in one write.
type digester struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

var digesters = sync.Pool{New: func() any {
	return &digester{h: sha256.New(), buf: make([]byte, 0, 256)}
}}

// maxPooledScratch bounds the scratch buffer a digester keeps between
// uses: one request with a long path or query does not pin its buffer.
const maxPooledScratch = 4 << 10

func getDigester() *digester {
	d := digesters.Get().(*digester)
	d.h.Reset()
	d.buf = d.buf[:0]
	return d
}

func (d *digester) put() {
	if cap(d.buf) > maxPooledScratch {
		d.buf = make([]byte, 0, 256)
	}
	digesters.Put(d)
}

// field adds s, prefixed by its length as 8 bytes big-endian.
func (d *digester) field(s string) {
	d.buf = binary.BigEndian.AppendUint64(d.buf, uint64(len(s)))
	d.buf = append(d.buf, s...)
}

// flush hashes the fields gathered so far.
func (d *digester) flush() {
	if len(d.buf) > 0 {
		d.h.Write(d.buf)
		d.buf = d.buf[:0]
	}
}

// hex returns prefix followed by the digest of everything added, in hex.
func (d *digester) hex(prefix string) string {
	d.flush()
	sum := d.h.Sum(d.sum[:0])
	out := append(d.buf[:0], prefix...)
	out = hex.AppendEncode(out, sum)
	return string(out)
}
