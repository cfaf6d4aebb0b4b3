package pgenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// Pair is a PostgreSQL primary and a hot standby streaming from it, both
// of the test's own (started by StartStandby, stopped when it ends).
type Pair struct {
	Primary, Standby *sql.DB // connections to the database postgres on each
}

// StartStandby starts a private PostgreSQL primary (initdb, from the
// binaries in IDEMGUARD_POSTGRES_BIN, which tools/services.sh sets, or
// else of the PostgreSQL that initdb on the PATH belongs to) and a hot
// standby made from it with pg_basebackup, and waits until the standby
// answers in recovery. As root, the servers run as the user postgres
// (PostgreSQL refuses to run as root). Without initdb the test is skipped,
// or fails under IDEMGUARD_REQUIRE_SERVICES=1. The shared database is not
// touched.
func StartStandby(t testing.TB) *Pair {
	t.Helper()
	initdb, err := findInitdb()
	if err != nil {
		if os.Getenv(testenv.EnvRequire) == "1" {
			t.Fatalf("a private primary and standby need PostgreSQL's initdb (%s or the PATH): %v", testenv.EnvPostgresBin, err)
		}
		t.Skipf("a private primary and standby need PostgreSQL's initdb (%s or the PATH): %v", testenv.EnvPostgresBin, err)
	}
	bin := filepath.Dir(initdb)
	dir, err := os.MkdirTemp("", "idemguard-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("PostgreSQL refuses to run as root, and there is no user postgres: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	primary, standby := filepath.Join(dir, "primary"), filepath.Join(dir, "standby")
	pport, sport := testenv.FreePort(t), testenv.FreePort(t)
	start := func(data string, port int) {
		t.Helper()
		t.Cleanup(func() { // also when pg_ctl gave up waiting: the postmaster is not left running
			cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
			if cred != nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			}
			_ = cmd.Run()
		})
		run("pg_ctl", "-D", data, "-l", data+".log", "-w", "-t", "60", "-o",
			fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c wal_level=replica -c max_wal_senders=4 -c hot_standby=on", port, dir),
			"start")
	}
	run("initdb", "-D", primary, "-A", "trust", "-U", "postgres", "--no-sync")
	start(primary, pport)
	run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(pport), "-U", "postgres", "-D", standby, "-R", "-X", "stream", "--no-sync")
	start(standby, sport)

	open := func(port int) *sql.DB {
		db, err := sql.Open("postgres", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	p := &Pair{Primary: open(pport), Standby: open(sport)}
	var recovering bool
	if err := p.Standby.QueryRowContext(context.Background(), `SELECT pg_is_in_recovery()`).Scan(&recovering); err != nil || !recovering {
		t.Fatalf("the standby: pg_is_in_recovery() = %v, %v; want true", recovering, err)
	}
	return p
}

// Replayed returns once the standby has replayed everything the primary
// had written when it was called.
func (p *Pair) Replayed(t testing.TB) {
	t.Helper()
	var lsn string
	if err := p.Primary.QueryRowContext(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the standby to replay the primary's writes", func() bool {
		var done bool
		err := p.Standby.QueryRowContext(context.Background(), `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		if err != nil {
			t.Fatal(err)
		}
		return done
	})
}

// findInitdb returns the path of PostgreSQL's initdb, symbolic links
// resolved (its directory holds the other binaries).
func findInitdb() (string, error) {
	if dir := os.Getenv(testenv.EnvPostgresBin); dir != "" {
		p := filepath.Join(dir, "initdb")
		if _, err := os.Stat(p); err != nil {
			return "", err
		}
		return filepath.EvalSymlinks(p)
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(p)
}
