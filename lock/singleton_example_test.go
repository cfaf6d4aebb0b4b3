package lock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/lock"
)

func ExampleSingleton() {
	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()
	ctx := context.Background()

	// Every instance schedules the purge; one at a time runs it.
	var purge func(ctx context.Context) error
	purge = lock.Singleton(l, "purge", func(ctx context.Context) error {
		// Another instance trying meanwhile is turned away.
		err := purge(ctx)
		fmt.Println("other instance skipped:", errors.Is(err, lock.ErrNotObtained))
		fmt.Println("purging expired keys")
		return nil
	})
	fmt.Println("err:", purge(ctx))
	// Output:
	// other instance skipped: true
	// purging expired keys
	// err: <nil>
}
