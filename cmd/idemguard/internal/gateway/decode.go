package gateway

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// FieldError is one mistake in a configuration file: where it is (line and
// column of the value, or of the mapping that lacks a field), which field
// (a path such as routes[2].key.body), and what is wrong.
type FieldError struct {
	File   string
	Line   int
	Column int
	Field  string
	Msg    string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// ConfigError is every mistake Load found in a file, in the order of the
// file. Its message has one line per mistake.
type ConfigError struct {
	Errs []*FieldError
}

func (e *ConfigError) Error() string {
	lines := make([]string, len(e.Errs))
	for i, fe := range e.Errs {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the mistakes, so errors.As finds a *FieldError.
func (e *ConfigError) Unwrap() []error {
	out := make([]error, len(e.Errs))
	for i, fe := range e.Errs {
		out[i] = fe
	}
	return out
}

// decoder walks a yaml.Node tree and collects FieldErrors.
type decoder struct {
	file string // the file's name, for the errors
	dir  string // its directory: relative paths in it start there
	errs []*FieldError
}

func (d *decoder) errorf(n *yaml.Node, field, format string, args ...any) {
	fe := &FieldError{File: d.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		fe.Line, fe.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, fe)
}

func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b *FieldError) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	return &ConfigError{Errs: d.errs}
}

// field is one key of a mapping: its value node and its path.
type field struct {
	key  *yaml.Node
	val  *yaml.Node
	path string
}

// mapping reads n as a mapping whose keys must be among known (in the
// order given, for the "did you mean" hint), and returns its fields by
// name. Unknown and repeated keys are errors.
func (d *decoder) mapping(n *yaml.Node, path string, known ...string) map[string]field {
	out := map[string]field{}
	if n == nil {
		return out
	}
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping (key: value), got %s", kindName(n))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		if _, dup := out[k.Value]; dup {
			d.errorf(k, p, "set twice (line %d first)", out[k.Value].key.Line)
			continue
		}
		if !slices.Contains(known, k.Value) {
			hint := ""
			if s := closest(k.Value, known); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.errorf(k, p, "unknown field%s; known fields here: %s", hint, strings.Join(known, ", "))
			continue
		}
		out[k.Value] = field{key: k, val: v, path: p}
	}
	return out
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// resolve follows an alias.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// scalar reads f as a scalar; ok is false (and an error recorded) for a
// list or mapping or null.
func (d *decoder) scalar(f field) (string, bool) {
	n := resolve(f.val)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		d.errorf(n, f.path, "want a value, got %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) str(f field) (string, bool) {
	s, ok := d.scalar(f)
	if ok && strings.TrimSpace(s) == "" {
		d.errorf(f.val, f.path, "empty")
		return "", false
	}
	return strings.TrimSpace(s), ok
}

func (d *decoder) boolean(f field) (bool, bool) {
	s, ok := d.scalar(f)
	if !ok {
		return false, false
	}
	switch strings.ToLower(s) {
	case "true", "yes", "on":
		return true, true
	case "false", "no", "off":
		return false, true
	}
	d.errorf(f.val, f.path, "want true or false, got %q", s)
	return false, false
}

func (d *decoder) integer(f field, lo, hi int64) (int64, bool) {
	s, ok := d.scalar(f)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < lo || v > hi {
		d.errorf(f.val, f.path, "want a whole number from %d to %d, got %q", lo, hi, s)
		return 0, false
	}
	return v, true
}

// duration reads a Go duration ("30s", "1m30s", "24h"); a bare number is
// refused, since its unit would be a guess.
func (d *decoder) duration(f field, lo, hi time.Duration) (time.Duration, bool) {
	s, ok := d.scalar(f)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil && durationSyntax.MatchString(strings.TrimSpace(s)) {
		// Well formed, but past time.Duration's 292 years.
		d.errorf(f.val, f.path, "%q is out of range: want %s to %s", s, lo, hi)
		return 0, false
	}
	if err != nil {
		d.errorf(f.val, f.path, "want a duration with its unit (\"500ms\", \"30s\", \"24h\"), got %q", s)
		return 0, false
	}
	if v < lo || v > hi {
		d.errorf(f.val, f.path, "%s is out of range: want %s to %s", v, lo, hi)
		return 0, false
	}
	return v, true
}

// durationSyntax is what time.ParseDuration reads, whatever the size of
// the numbers: one it refuses that matches is out of range.
var durationSyntax = regexp.MustCompile(`^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$`)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"kB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// size reads a byte count: a whole number of bytes, or one with a unit
// (B, kB/KB, MB, GB, KiB, MiB, GiB).
func (d *decoder) size(f field, lo, hi int64) (int64, bool) {
	s, ok := d.scalar(f)
	if !ok {
		return 0, false
	}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if rest, cut := strings.CutSuffix(num, u.suffix); cut {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if errors.Is(err, strconv.ErrRange) && num[0] != '-' || err == nil && v > math.MaxInt64/mult {
		d.errorf(f.val, f.path, "%q is out of range: want %d to %d bytes", s, lo, hi)
		return 0, false
	}
	if err != nil || v < 0 {
		d.errorf(f.val, f.path, "want a size in bytes (\"65536\", \"512KiB\", \"1MiB\"), got %q", s)
		return 0, false
	}
	v *= mult
	if v < lo || v > hi {
		d.errorf(f.val, f.path, "%d bytes is out of range: want %d to %d", v, lo, hi)
		return 0, false
	}
	return v, true
}

func (d *decoder) enum(f field, choices ...string) (string, bool) {
	s, ok := d.str(f)
	if !ok {
		return "", false
	}
	if !slices.Contains(choices, s) {
		d.errorf(f.val, f.path, "%q is not one of %s", s, strings.Join(choices, ", "))
		return "", false
	}
	return s, true
}

// list reads f as a list of scalars; a single scalar is a list of one.
func (d *decoder) list(f field) ([]string, []*yaml.Node, bool) {
	n := resolve(f.val)
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag != "!!null":
		if strings.TrimSpace(n.Value) == "" {
			d.errorf(n, f.path, "empty")
			return nil, nil, false
		}
		return []string{strings.TrimSpace(n.Value)}, []*yaml.Node{n}, true
	case n.Kind != yaml.SequenceNode:
		d.errorf(n, f.path, "want a list, got %s", kindName(n))
		return nil, nil, false
	}
	var out []string
	var nodes []*yaml.Node
	ok := true
	for i, item := range n.Content {
		s, good := d.str(field{val: item, path: fmt.Sprintf("%s[%d]", f.path, i)})
		if !good {
			ok = false
			continue
		}
		out = append(out, s)
		nodes = append(nodes, item)
	}
	if ok && len(out) == 0 {
		d.errorf(n, f.path, "empty list")
		return nil, nil, false
	}
	return out, nodes, ok
}

// closest returns the known name nearest to s (edit distance at most 2),
// or "".
func closest(s string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if dd := editDistance(strings.ToLower(s), k); dd < bestD {
			best, bestD = k, dd
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// errNoDocument: the file holds no configuration at all.
var errNoDocument = errors.New("the file is empty")
