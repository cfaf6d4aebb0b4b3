package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/memstore"
)

// runInventory prints the idempotency inventory of the demo service.
func runInventory(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inventory")
	format := fs.String("format", "markdown", "markdown (a table) or json")
	unsafe := fs.String("unsafe", "POST,PATCH", "comma-separated methods whose unguarded routes are gaps (add PUT,DELETE when those are not idempotent)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *format != "markdown" && *format != "json" {
		return usagef("--format %q: want markdown or json", *format)
	}
	methods, err := methodList(*unsafe)
	if err != nil {
		return usagef("--unsafe: %v", err)
	}
	inv, err := demoInventory(inventory.Options{UnsafeMethods: methods})
	if err != nil {
		return err
	}
	if *format == "json" {
		b, err := inv.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	fmt.Fprintln(stdout, "# Idempotency inventory: the demo service (idemguard demo)")
	fmt.Fprintln(stdout)
	return inv.WriteMarkdown(stdout)
}

// methodList reads a comma-separated list of HTTP methods.
func methodList(s string) ([]string, error) {
	var out []string
	for m := range strings.SplitSeq(s, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" {
			continue
		}
		for _, c := range m {
			if !tokenChar(c) {
				return nil, fmt.Errorf("%q is not an HTTP method", m)
			}
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no methods in %q", s)
	}
	return out, nil
}

// tokenChar reports whether c may be in an HTTP method, a token of RFC
// 9110 (section 5.6.2): M-SEARCH and VERSION-CONTROL are methods too.
func tokenChar(c rune) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c < utf8.RuneSelf && strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}

// demoInventory builds the demo service's routes and consumer as the demo
// does (demoRoutes, demoConsumer), on an in-memory store, and returns
// what they registered. Nothing is served and nothing is connected to.
func demoInventory(opts inventory.Options) (*inventory.Inventory, error) {
	inv := inventory.New(opts)
	var c demoConfig
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: demoTTL})
	quiet := slog.New(slog.DiscardHandler)
	demoRoutes(inventory.NewServeMux(inv, nil), g, c, quiet, http.NotFoundHandler(),
		func(next http.Handler) http.Handler { return next })

	// The consumer's New does not connect: the client is never used.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	o := redisstream.Options{Consumer: "inventory", Logger: quiet,
		Process: consumerx.Options{Inventory: inv, Logger: quiet}}
	demoConsumer(&o, "idemguard-demo:orders", c)
	if _, err := redisstream.New(rdb, g, func(context.Context, consumerx.Message) error { return nil }, o); err != nil {
		return nil, fmt.Errorf("the demo's consumer: %w", err)
	}
	return inv, nil
}
