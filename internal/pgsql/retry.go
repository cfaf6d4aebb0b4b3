package pgsql

import (
	"context"
	"math/rand/v2"
	"time"
)

// RaceRetries bounds how many times RetryLostRace runs a statement again.
const RaceRetries = 16

// LostRace reports a serialization failure (40001) or a deadlock (40P01):
// the transaction lost to a concurrent one, was rolled back and changed
// nothing.
func LostRace(err error) bool {
	code, _ := SQLState(err)
	return code == "40001" || code == "40P01"
}

// RetryLostRace runs run, a statement in a transaction of its own, and
// runs it again while it fails with LostRace: up to RaceRetries more
// times, a millisecond or more apart (doubling to 32 ms, with jitter),
// and no more once ctx ended. At READ COMMITTED, PostgreSQL's default, the
// statements of idemguard's tables never fail so; on a database whose
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE, one
// that waited for a concurrent write of its row does. It returns run's
// last error.
func RetryLostRace(ctx context.Context, run func() error) error {
	pause := time.Millisecond
	for i := 0; ; i++ {
		err := run()
		if err == nil || i == RaceRetries || !LostRace(err) {
			return err
		}
		t := time.NewTimer(pause + rand.N(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 32*time.Millisecond)
	}
}
