package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/gateway"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/memstore"
)

// runServe runs the idempotency gateway: a reverse proxy that guards the
// routes its configuration lists (cmd/idemguard/internal/gateway).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve")
	config := fs.String("config", "", "the configuration file, YAML or JSON (README.md: \"Run it in front of any service\")")
	printInv := fs.Bool("print-inventory", false, "print the routes the configuration guards, and its gaps, then exit")
	format := fs.String("format", "markdown", "with --print-inventory: markdown (a table) or json")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *config == "" {
		return usagef("--config FILE is required")
	}
	if *format != "markdown" && *format != "json" {
		return usagef("--format %q: want markdown or json", *format)
	}
	if !*printInv {
		// --format alone would start the gateway, which an operator who
		// meant to print the inventory did not ask for.
		formatSet := false
		fs.Visit(func(f *flag.Flag) { formatSet = formatSet || f.Name == "format" })
		if formatSet {
			return usagef("--format goes with --print-inventory")
		}
	}
	cfg, err := gateway.Load(*config)
	if ce, ok := errors.AsType[*gateway.ConfigError](err); ok {
		for _, fe := range ce.Errs {
			fmt.Fprintf(stderr, "idemguard serve: %s\n", fe)
		}
		return fmt.Errorf("%s: %d mistake(s) in the configuration; nothing was started", *config, len(ce.Errs))
	}
	if err != nil {
		return err
	}
	if *printInv {
		// Built on an in-memory store: nothing is connected to.
		gw, err := gateway.New(cfg, gateway.Options{Store: memstore.New(memstore.Options{})})
		if err != nil {
			return err
		}
		defer gw.Close()
		return printInventory(stdout, gw.Inventory(), *format, "# Idempotency inventory: idemguard serve --config "+*config)
	}
	gw, err := gateway.New(cfg, gateway.Options{Stderr: stderr})
	if err != nil {
		return err
	}
	defer gw.Close()
	return gw.Run(ctx, nil)
}

// printInventory writes inv as a Markdown table under title, or as JSON.
func printInventory(w io.Writer, inv *inventory.Inventory, format, title string) error {
	if format == "json" {
		b, err := inv.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	fmt.Fprintln(w, title)
	fmt.Fprintln(w)
	return inv.WriteMarkdown(w)
}
