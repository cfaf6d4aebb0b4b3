package httpx_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestWaitPassingKeepsPace: Options.Wait documents its cost (reads
// 10 ms, then twice as late, at most 100 ms apart: "each further second
// of waiting costs about 10 reads"). A duplicate whose Wait of 500 ms
// passes while the first request runs costs its claim and about 8 reads
// (10, 30, 70, 150, 250, 350, 450, 490 ms); 20 Redis commands is a
// generous bound. It cost several times that: guard.Wait read back to
// back in the last 10 ms before its Timeout.
func TestWaitPassingKeepsPace(t *testing.T) {
	e := newEnv(t, guard.Options{Lease: time.Minute})
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{Wait: 500 * time.Millisecond}))
	done := sync.OnceFunc(func() { close(release) })
	t.Cleanup(done)
	first := make(chan reply, 1)
	go func() { first <- do(t, c, "POST", srv.URL+"/o", "a", key("wait-pace")...) }()
	<-entered
	before := e.commands.n.Load()
	r := do(t, c, "POST", srv.URL+"/o", "a", key("wait-pace")...)
	cmds := e.commands.n.Load() - before
	done()
	<-first
	if r.status != http.StatusConflict {
		t.Fatalf("duplicate: %d, want 409 after the Wait bound", r.status)
	}
	t.Logf("the waiting duplicate sent %d Redis commands in its 500 ms wait", cmds)
	if cmds > 20 {
		t.Fatalf("a duplicate waiting 500 ms sent %d Redis commands, want about 10 (documented: reads at most every 10–100 ms, about 10 per second)", cmds)
	}
}
