package lock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"

	"github.com/idemguard/idemguard/lock"
)

// threeNodes starts three embedded Redis servers (miniredis) standing in
// for three independent Redis nodes, and returns their addresses and a
// function that stops them.
func threeNodes() ([]string, func()) {
	var addrs []string
	var servers []*miniredis.Miniredis
	for range 3 {
		s, err := miniredis.Run()
		if err != nil {
			panic(err)
		}
		servers = append(servers, s)
		addrs = append(addrs, s.Addr())
	}
	return addrs, func() {
		for _, s := range servers {
			s.Close()
		}
	}
}

// exampleLocker returns a Locker over three embedded nodes, built as
// ExampleNew shows, and a function that closes it all.
func exampleLocker(opts lock.Options) (*lock.Locker, func()) {
	addrs, stopNodes := threeNodes()
	nodes := lock.NewNodes(addrs...)
	l, err := lock.New(nodes, opts)
	if err != nil {
		panic(err)
	}
	return l, func() {
		for _, c := range nodes {
			_ = c.Close()
		}
		stopNodes()
	}
}

func ExampleNew() {
	addrs, stop := threeNodes()
	defer stop()
	nodes := lock.NewNodes(addrs...)
	defer func() {
		for _, c := range nodes {
			_ = c.Close()
		}
	}()

	l, err := lock.New(nodes, lock.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Println("quorum:", l.Quorum(), "of", len(nodes))
	// Output: quorum: 2 of 3
}

func ExampleLocker_Do() {
	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()

	err := l.Do(context.Background(), "account:42", func(ctx context.Context) error {
		// Only one holder at a time runs here. Stop when ctx ends:
		// context.Cause(ctx) is lock.ErrLost if the lock was lost.
		fmt.Println("rebalancing account 42")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// rebalancing account 42
	// err: <nil>
}

func ExampleLocker_TryDo() {
	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()
	ctx := context.Background()

	_ = l.Do(ctx, "report", func(ctx context.Context) error {
		// While this holder runs, a TryDo of the same name gives up at once.
		err := l.TryDo(ctx, "report", func(context.Context) error { return nil })
		fmt.Println("taken:", errors.Is(err, lock.ErrNotObtained))
		return nil
	})
	err := l.TryDo(ctx, "report", func(context.Context) error {
		fmt.Println("free again")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// taken: true
	// free again
	// err: <nil>
}

func ExampleLocker_Obtain() {
	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()
	ctx := context.Background()

	k, err := l.Obtain(ctx, "migration")
	if err != nil {
		panic(err)
	}
	// Work in steps, extending before k.Until().
	if err := k.Extend(ctx); err != nil {
		fmt.Println("lost:", errors.Is(err, lock.ErrLost))
		return
	}
	fmt.Println("release:", k.Release(ctx))
	fmt.Println("release again:", errors.Is(k.Release(ctx), lock.ErrLost))
	// Output:
	// release: <nil>
	// release again: true
}

func ExampleLocker_TryObtain() {
	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()
	ctx := context.Background()

	k, err := l.TryObtain(ctx, "nightly")
	if err != nil {
		panic(err)
	}
	defer k.Release(ctx)
	_, err = l.TryObtain(ctx, "nightly")
	fmt.Println("second instance:", errors.Is(err, lock.ErrNotObtained))
	// Output: second instance: true
}

func ExampleFromContext() {
	l, stop := exampleLocker(lock.Options{Fencing: true}) // three embedded nodes
	defer stop()
	ctx := context.Background()

	for range 2 {
		_ = l.Do(ctx, "account:42", func(ctx context.Context) error {
			k := lock.FromContext(ctx)
			// Pass k.Fence() with the write; the store keeps the highest it
			// saw and rejects lower ones from a holder that lost the lock.
			fmt.Println(k.Name(), "fence", k.Fence())
			return nil
		})
	}
	// Output:
	// account:42 fence 1
	// account:42 fence 2
}
