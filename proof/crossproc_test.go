package proof

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// The child process' settings, passed by the parent test.
const (
	childEnv    = "IDEMGUARD_PROOF_CHILD" // the child's number; set only in a child
	childDSN    = "IDEMGUARD_PROOF_DSN"
	childPrefix = "IDEMGUARD_PROOF_PREFIX"
	childKeys   = "IDEMGUARD_PROOF_KEYS"
	childDups   = "IDEMGUARD_PROOF_DUPS"
)

// Two OS processes (this test binary, run again) share one Redis and one
// PostgreSQL. Each sends every one of 200 keys 8 times, concurrently; the
// effect writes a business row in the backstop's transaction. Exactly 200
// business rows exist at the end, one per key, and every key's stored
// result is its row.
func TestTwoProcessesOneEffectPerKey(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child process")
	}
	t.Parallel() // a drill: see TestMain
	const procs, keys, dups = 2, 200, 8
	bk := newBank(t)
	prefix := testenv.Prefix(t)
	redisAddr := testenv.RedisAddr(t)

	type child struct {
		cmd *exec.Cmd
		in  *os.File
		out *bufio.Reader
		log strings.Builder
	}
	children := make([]*child, procs)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			childEnv+"="+strconv.Itoa(i+1), childDSN+"="+bk.dsn, childPrefix+"="+prefix,
			childKeys+"="+strconv.Itoa(keys), childDups+"="+strconv.Itoa(dups))
		c := &child{cmd: cmd}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = &c.log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.in, c.out = stdin.(*os.File), bufio.NewReader(stdout)
		children[i] = c
	}
	// Wait until every child is ready, then start them together.
	for i, c := range children {
		for {
			line, err := c.out.ReadString('\n')
			if err != nil {
				_ = c.cmd.Wait()
				t.Fatalf("child %d ended before it was ready: %v\n%s", i+1, err, c.log.String())
			}
			if strings.TrimSpace(line) == "ready" {
				break
			}
		}
	}
	for _, c := range children {
		_, _ = c.in.WriteString("go\n")
		_ = c.in.Close()
	}
	var wg sync.WaitGroup
	outs := make([]string, procs)
	for i, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := io.ReadAll(c.out)
			outs[i] = string(b)
		}()
	}
	wg.Wait()
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s%s", i+1, err, outs[i], c.log.String())
		}
	}

	rows := bk.rows(t, "xproc")
	total, byPid := 0, map[string]int{}
	for _, vs := range rows {
		total += len(vs)
		for _, v := range vs {
			byPid[v[strings.LastIndexByte(v, '/')+1:]]++
		}
	}
	if total != keys || len(rows) != keys {
		t.Fatalf("%d business rows over %d keys, want exactly %d, one per key", total, len(rows), keys)
	}
	g := guard.New(guardenv.Store(t, guard.RedisOptions{Prefix: prefix}), guard.Options{})
	for id, vs := range rows {
		r, err := g.Get(context.Background(), guard.Key{Scope: "xproc", ID: id})
		if err != nil || r.State != guard.StateCompleted || string(r.Result) != vs[0] {
			t.Errorf("key %s: record %+v, %v; want completed with its row %q", id, r, err, vs[0])
		}
	}
	t.Logf("%d rows for %d keys; effects by process: %v (Redis %s)", total, len(rows), byPid, redisAddr)
}

// TestCrossProcessChild is the child side of TestTwoProcessesOneEffectPerKey;
// it runs only in a child process.
func TestCrossProcessChild(t *testing.T) {
	id := os.Getenv(childEnv)
	if id == "" {
		t.Skip("runs only as a child of TestTwoProcessesOneEffectPerKey")
	}
	pid, _ := strconv.Atoi(id)
	keys, _ := strconv.Atoi(os.Getenv(childKeys))
	dups, _ := strconv.Atoi(os.Getenv(childDups))
	db, err := sql.Open("postgres", os.Getenv(childDSN))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = db.Close() })
	bk := openBank(t, db, os.Getenv(childDSN), false)
	g := guard.New(guardenv.Store(t, guard.RedisOptions{Prefix: os.Getenv(childPrefix)}), guard.Options{Lease: 2 * time.Second, TTL: time.Hour})

	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("waiting for the start: %v", err)
	}
	var wg sync.WaitGroup
	for d := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(pid), uint64(d)))
			for _, i := range r.Perm(keys) {
				k := guard.Key{Scope: "xproc", ID: strconv.Itoa(i)}
				res := settle(t, context.Background(), g, k, "fp", bk.effect("fp", pid), 30*time.Second)
				if len(res.Value) == 0 {
					t.Errorf("%s: empty result", k)
				}
			}
		}()
	}
	wg.Wait()
}
