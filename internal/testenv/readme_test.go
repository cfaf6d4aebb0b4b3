package testenv_test

// TestSnippetsInTests keeps README.md's Go snippets honest: each ```go
// block must appear, verbatim up to indentation, in the readme_test.go of
// the package whose API it shows, where it is compiled (and run where it
// can run). Editing a snippet without its test, or the test without the
// snippet, fails here; a snippet that stops compiling fails in its package.
//
// It is in the root module, beside README.md, so every `go test ./...` of
// the repository runs it; it reads the other modules' readme_test.go files
// as text, so it needs none of their dependencies. It is in testenv, the
// root module's test toolkit, rather than a package of its own: a new
// package would change tools/deppic.sh's picture, which docs/design.md
// draws.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// snippets names, in README order, the file that holds each ```go block.
var snippets = []string{
	"guard/readme_test.go",                 // Quick start
	"httpx/readme_test.go",                 // HTTP
	"inventory/readme_test.go",             // Inventory
	"httpx/readme_test.go",                 // the SQL backstop behind a handler
	"ginx/readme_test.go",                  // Gin
	"echox/readme_test.go",                 // Echo
	"fiberx/readme_test.go",                // Fiber
	"grpcx/readme_test.go",                 // gRPC
	"grpcx/connectx/readme_test.go",        // Connect
	"otelx/readme_test.go",                 // Tracing
	"guard/readme_test.go",                 // Partial failures: steps
	"consumerx/redisstream/readme_test.go", // Redis Streams
}

func TestSnippetsInTests(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(string(readme))
	if len(blocks) != len(snippets) {
		t.Fatalf("README.md has %d ```go blocks, this test knows %d: add the new snippet to the readme_test.go "+
			"of the package it shows, and its file to snippets", len(blocks), len(snippets))
	}
	for i, b := range blocks {
		src, err := os.ReadFile(filepath.Join(root, snippets[i]))
		if err != nil {
			t.Errorf("README.md:%d: %v", b.line, err)
			continue
		}
		if !containsDedented(strings.Split(string(src), "\n"), dedent(b.lines)) {
			t.Errorf("README.md:%d: the ```go block is not in %s verbatim (up to indentation); change both together:\n%s",
				b.line, snippets[i], strings.Join(b.lines, "\n"))
		}
	}
}

// block is one ```go block: its lines and the README line it starts on.
type block struct {
	line  int
	lines []string
}

func goBlocks(md string) []block {
	var out []block
	var cur *block
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &block{line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// dedent removes the leading whitespace every non-blank line shares, and
// makes blank lines empty.
func dedent(lines []string) []string {
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ind := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = ind, false
			continue
		}
		for !strings.HasPrefix(ind, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			out[i] = strings.TrimPrefix(l, prefix)
		}
	}
	return out
}

// containsDedented reports whether some run of len(want) lines of src,
// dedented, is want.
func containsDedented(src, want []string) bool {
	for i := 0; i+len(want) <= len(src); i++ {
		got := dedent(src[i : i+len(want)])
		if strings.Join(got, "\n") == strings.Join(want, "\n") {
			return true
		}
	}
	return false
}

// TestContainsDedented: a snippet is found at any indentation, and a
// changed line or indentation inside it is not the snippet.
func TestContainsDedented(t *testing.T) {
	src := strings.Split("func f() {\n\tif x {\n\t\ty()\n\n\t}\n}", "\n")
	for _, c := range []struct {
		want  string
		found bool
	}{
		{"if x {\n\ty()\n\n}", true},
		{"\t\tif x {\n\t\t\ty()\n\n\t\t}", true}, // a README block indented as a whole
		{"if x {\n\tz()\n\n}", false},
		{"if x {\n    y()\n\n}", false},
		{"if x {\n\ty()\n}", false},
	} {
		if got := containsDedented(src, dedent(strings.Split(c.want, "\n"))); got != c.found {
			t.Errorf("%q: found %v, want %v", c.want, got, c.found)
		}
	}
}
