package occ

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The text form of a Vector is its entries in ascending order of writer id,
// each "writer:counter", joined by commas: "eu-west:3,us-east:12". The
// empty vector is the empty string. In a writer id every byte but ASCII
// letters, digits and "-._~" is written %XX (upper-case hex), so ids may
// hold any character. The form is canonical: one vector has exactly one
// text, so two texts are equal exactly when their vectors are (it can serve
// as an ETag), and Parse accepts nothing else.

// String returns the canonical text form ("eu-west:3,us-east:12").
func (v Vector) String() string {
	var sb strings.Builder
	for i, x := range v.e {
		if i > 0 {
			sb.WriteByte(',')
		}
		escapeWriter(&sb, x.w)
		sb.WriteByte(':')
		sb.WriteString(strconv.FormatUint(x.n, 10))
	}
	return sb.String()
}

// MarshalText returns the canonical text form; it never fails.
func (v Vector) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText sets *v to the vector Parse reads from text; on an error
// *v is unchanged.
func (v *Vector) UnmarshalText(text []byte) error {
	p, err := Parse(string(text))
	if err != nil {
		return err
	}
	*v = p
	return nil
}

// Parse reads the canonical text form String writes. It refuses anything
// else with an error saying what is wrong: entries out of order or
// repeated, a zero counter, a counter with a sign or leading zeros or above
// 2^64-1, an escape that is not needed or not upper-case, an empty or
// invalid writer id.
func Parse(s string) (Vector, error) {
	if s == "" {
		return Vector{}, nil
	}
	parts := strings.Split(s, ",")
	e := make([]entry, 0, len(parts))
	for i, part := range parts {
		ew, num, ok := strings.Cut(part, ":")
		if !ok {
			return Vector{}, textErr(i, part, "no ':' between writer and counter")
		}
		w, err := unescapeWriter(ew)
		if err != nil {
			return Vector{}, textErr(i, part, err.Error())
		}
		if err := ValidWriter(w); err != nil {
			return Vector{}, textErr(i, part, err.Error())
		}
		n, err := parseCounter(num)
		if err != nil {
			return Vector{}, textErr(i, part, err.Error())
		}
		if n == 0 {
			return Vector{}, textErr(i, part, "zero counter (a writer without writes is left out)")
		}
		if i > 0 && e[i-1].w >= w {
			return Vector{}, textErr(i, part, "writers out of order or repeated")
		}
		e = append(e, entry{w, n})
	}
	return Vector{e: e}, nil
}

func textErr(i int, part, why string) error {
	if len(part) > 64 {
		part = part[:64] + "…"
	}
	return fmt.Errorf("occ: version vector text, entry %d %q: %s", i, part, why)
}

// parseCounter reads a decimal counter without sign or leading zeros.
func parseCounter(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty counter")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("counter %q is not a decimal number", s)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("counter %q has a leading zero", s)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counter %q is above 2^64-1", s)
	}
	return n, nil
}

// integralPart returns s without a fraction of zeros only ("3.00" → "3");
// any other s as it is, for parseCounter to judge.
func integralPart(s string) string {
	i, frac, ok := strings.Cut(s, ".")
	if !ok || frac == "" || strings.Trim(frac, "0") != "" {
		return s
	}
	return i
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

const upperHex = "0123456789ABCDEF"

func escapeWriter(sb *strings.Builder, w string) {
	for i := 0; i < len(w); i++ {
		c := w[i]
		if unreserved(c) {
			sb.WriteByte(c)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(upperHex[c>>4])
		sb.WriteByte(upperHex[c&15])
	}
}

func unescapeWriter(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		if c != '%' {
			return "", fmt.Errorf("byte %q must be written %%%02X", c, c)
		}
		if i+2 >= len(s) {
			return "", errors.New("'%' without two hex digits")
		}
		hi, lo := strings.IndexByte(upperHex, s[i+1]), strings.IndexByte(upperHex, s[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("escape %q is not two upper-case hex digits", s[i:i+3])
		}
		d := byte(hi<<4 | lo)
		if unreserved(d) {
			return "", fmt.Errorf("escape %q stands for %q, which is written as it is", s[i:i+3], d)
		}
		b.WriteByte(d)
		i += 2
	}
	return b.String(), nil
}

// MarshalJSON returns the JSON form: an object from writer id to counter,
// keys in ascending order: {"eu-west":3,"us-east":12}. The empty vector is
// {}. It never fails.
func (v Vector) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, x := range v.e {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(x.w)
		if err != nil { // unreachable: writer ids are valid UTF-8
			return nil, fmt.Errorf("occ: version vector writer %q: %w", x.w, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(x.n, 10))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a JSON object from writer id to counter, in any key
// order and spacing (PostgreSQL's jsonb reorders keys), or null for the
// empty vector. Counters must be integers from 0 to 2^64-1 written in
// decimal without exponent, with no fraction or one of zeros only (3.0:
// jsonb keeps a number as it was written, and the migration's CHECK takes
// it); zero counters are dropped. A repeated key, an invalid writer id or
// a value of another kind is an error. On an error *v is unchanged.
func (v *Vector) UnmarshalJSON(data []byte) error {
	// encoding/json reads bytes that are not UTF-8, and a surrogate escape
	// outside a pair, as U+FFFD: writer ids ValidWriter would refuse would
	// pass as that character.
	if !utf8.Valid(data) {
		return errors.New("occ: version vector JSON: not valid UTF-8")
	}
	if loneSurrogate(data) {
		return errors.New("occ: version vector JSON: a \\u escape of half a surrogate pair")
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	tok, err := d.Token()
	if err != nil {
		return fmt.Errorf("occ: version vector JSON: %w", err)
	}
	var e []entry
	switch tok {
	case nil: // null
	case json.Delim('{'):
		seen := make(map[string]bool)
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return fmt.Errorf("occ: version vector JSON: %w", err)
			}
			k := kt.(string) // object keys are always strings
			if err := ValidWriter(k); err != nil {
				return fmt.Errorf("occ: version vector JSON: %w", err)
			}
			if seen[k] {
				return fmt.Errorf("occ: version vector JSON: writer %q appears twice", k)
			}
			seen[k] = true
			vt, err := d.Token()
			if err != nil {
				return fmt.Errorf("occ: version vector JSON: %w", err)
			}
			num, ok := vt.(json.Number)
			if !ok {
				return fmt.Errorf("occ: version vector JSON: writer %q: counter is %v, not a number", k, vt)
			}
			n, err := parseCounter(integralPart(num.String()))
			if err != nil {
				return fmt.Errorf("occ: version vector JSON: writer %q: %w", k, err)
			}
			if n > 0 {
				e = append(e, entry{k, n})
			}
		}
		if _, err := d.Token(); err != nil { // the closing brace
			return fmt.Errorf("occ: version vector JSON: %w", err)
		}
	default:
		return fmt.Errorf("occ: version vector JSON is %v, not an object", tok)
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("occ: version vector JSON: data after the value")
	}
	sortEntries(e)
	*v = Vector{e: e}
	return nil
}

// Value implements driver.Valuer: the JSON form, as text, for a jsonb
// column (lib/pq and pgx's database/sql driver both take it).
func (v Vector) Value() (driver.Value, error) {
	b, err := v.MarshalJSON()
	return string(b), err
}

// Scan implements sql.Scanner for a jsonb (or json, or text) column that
// holds the JSON form. SQL NULL is an error, not the empty vector: scan a
// nullable column into sql.Null[occ.Vector]. On an error *v is unchanged.
func (v *Vector) Scan(src any) error {
	switch s := src.(type) {
	case []byte:
		return v.UnmarshalJSON(s)
	case string:
		return v.UnmarshalJSON([]byte(s))
	case nil:
		return errors.New("occ: version vector column is NULL (scan a nullable column into sql.Null[occ.Vector])")
	}
	return fmt.Errorf("occ: cannot scan %T into a version vector", src)
}

// loneSurrogate reports whether JSON text holds a \u escape of a
// surrogate (U+D800 to U+DFFF) that is not the first or second half of a
// pair of such escapes.
func loneSurrogate(data []byte) bool {
	for i := 0; i+1 < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if data[i+1] != 'u' {
			i++ // an escaped character, a backslash among them
			continue
		}
		r := rune(hex4(data, i+2))
		switch {
		case !utf16.IsSurrogate(r):
			i += 5
		case i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' &&
			utf16.DecodeRune(r, rune(hex4(data, i+8))) != unicode.ReplacementChar:
			i += 11 // a pair
		default:
			return true
		}
	}
	return false
}

// hex4 reads the four hex digits at data[i:], or returns -1.
func hex4(data []byte, i int) int {
	if i+4 > len(data) {
		return -1
	}
	n, err := strconv.ParseUint(string(data[i:i+4]), 16, 16)
	if err != nil {
		return -1
	}
	return int(n)
}
