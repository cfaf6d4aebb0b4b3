package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// The demo's progress: a bar on a terminal, plain lines elsewhere.
// progress shows a bar on a terminal and a line every quarter otherwise.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	total int64
	done  atomic.Int64
	mu    sync.Mutex
	shown int64 // quarters printed
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newProgress(w io.Writer, total int, terminal bool) *progress {
	p := &progress{w: w, total: int64(total)}
	if terminal {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("storms"), progressbar.OptionShowCount(),
			progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(50*time.Millisecond))
	}
	return p
}

func (p *progress) add(n int) {
	d := p.done.Add(int64(n))
	if p.bar != nil {
		_ = p.bar.Add(n)
		return
	}
	q := d * 4 / max(p.total, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.shown < q && p.shown < 4 {
		p.shown++
		fmt.Fprintf(p.w, "progress: %d%% (%d of %d requests and messages)\n", p.shown*25, d, p.total)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
