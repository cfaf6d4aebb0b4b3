package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lib/pq" // PostgreSQL driver for --postgres
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/gateway"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// defaultRedis is the address the operator commands use without --redis.
const defaultRedis = "127.0.0.1:6379"

// connectTimeout bounds how long a command waits for a service to answer.
const connectTimeout = 3 * time.Second

// redisFlags are the flags every Redis-reading command takes.
type redisFlags struct {
	addr   *string
	prefix *string
	shown  *string // the server's host:port, without a password: what messages name
}

func addRedisFlags(fs *flag.FlagSet) redisFlags {
	prefix := prefixFlag(guard.DefaultPrefix)
	fs.Var(&prefix, "prefix", "the key `prefix` the guard was given (guard.RedisOptions.Prefix; empty: the default, as there)")
	return redisFlags{
		addr:   fs.String("redis", defaultRedis, "Redis host:port, or a redis:// (rediss:// for TLS) URL with the user, password and database"),
		prefix: (*string)(&prefix),
		shown:  new(string),
	}
}

// prefixFlag is --prefix: an empty value is guard.DefaultPrefix, as an
// empty guard.RedisOptions.Prefix is, so that the records, the names
// inspect recognises and a gateway's fallback rows are all looked for
// under the prefix the guard used.
type prefixFlag string

func (p *prefixFlag) String() string { return string(*p) }

func (p *prefixFlag) Set(s string) error {
	*p = prefixFlag(cmp.Or(s, guard.DefaultPrefix))
	return nil
}

// options reads --redis: host:port, or a redis:// or rediss:// URL.
func (f redisFlags) options() (*redis.Options, error) {
	var opts *redis.Options
	if strings.Contains(*f.addr, "://") {
		o, err := redis.ParseURL(*f.addr)
		if err != nil {
			return nil, usagef("--redis: %v", redactDSN(err, *f.addr))
		}
		opts = o
	} else {
		if _, _, err := net.SplitHostPort(*f.addr); err != nil {
			return nil, usagef("--redis %q: want host:port or a redis:// URL", *f.addr)
		}
		opts = &redis.Options{Addr: *f.addr}
	}
	opts.DialTimeout, opts.DialerRetries, opts.MaxRetries = connectTimeout, 1, 1
	*f.shown = opts.Addr
	return opts, nil
}

// open connects to Redis and checks it answers. A node of a Redis Cluster
// stands for the whole Cluster: the client then follows every key to its
// master, and list scans every master. The caller closes the client.
func (f redisFlags) open(ctx context.Context) (redis.UniversalClient, *guard.RedisStore, error) {
	opts, err := f.options()
	if err != nil {
		return nil, nil, err
	}
	c := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, nil, tlsHint(opts, redisErr(*f.shown, err))
	}
	clustered, err := isCluster(pctx, c)
	if err != nil {
		_ = c.Close()
		return nil, nil, redisErr(*f.shown, err)
	}
	if !clustered {
		return c, guard.NewRedisStore(c, guard.RedisOptions{Prefix: *f.prefix}), nil
	}
	_ = c.Close()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{opts.Addr},
		Username: opts.Username, Password: opts.Password, TLSConfig: opts.TLSConfig,
		DialTimeout: opts.DialTimeout, DialerRetries: opts.DialerRetries, MaxRetries: opts.MaxRetries})
	if err := cc.ForEachMaster(pctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err != nil {
		_ = cc.Close()
		return nil, nil, redisErr("a master of the cluster of "+*f.shown, err)
	}
	return cc, guard.NewRedisStore(cc, guard.RedisOptions{Prefix: *f.prefix}), nil
}

// isCluster reports whether c's server is a node of a Redis Cluster: by
// INFO, or, where INFO is not allowed (an operator's ACL user without
// @dangerous, a renamed command), by CLUSTER INFO, which a standalone
// server refuses ("cluster support disabled", or an unknown command). A
// user allowed neither (NOPERM) is refused: taken for a standalone
// server, a Cluster's node would have list scan one master of many.
func isCluster(ctx context.Context, c *redis.Client) (bool, error) {
	info, err := c.Info(ctx, "cluster").Result()
	if err == nil {
		return strings.Contains(info, "cluster_enabled:1"), nil
	}
	var refused redis.Error
	if !errors.As(err, &refused) {
		return false, err
	}
	_, cerr := c.ClusterInfo(ctx).Result()
	switch {
	case cerr == nil:
		return true, nil
	case !errors.As(cerr, &refused):
		return false, cerr
	case strings.HasPrefix(cerr.Error(), "NOPERM"):
		return false, fmt.Errorf("cannot tell a Cluster from a standalone server (INFO: %v; CLUSTER INFO: %w): allow one of them to this user", err, cerr)
	}
	return false, nil
}

// redisErr says whether the server at addr refused (an error reply: a
// password wanted or wrong, a loading or misconfigured server) or did not
// answer at all.
func redisErr(addr string, err error) error {
	var refused redis.Error
	if errors.As(err, &refused) {
		return fmt.Errorf("redis at %s refused: %w", addr, err)
	}
	return fmt.Errorf("redis at %s does not answer: %w", addr, err)
}

// tlsHint adds to err, the first answer of a server that took the
// connection but did not answer as Redis does, a hint that the two ends
// may not agree on TLS: a rediss:// URL to a plain-text port waits out
// the dial timeout, and a plain one to a TLS port is hung up on.
func tlsHint(opts *redis.Options, err error) error {
	var refused redis.Error
	var netErr *net.OpError
	switch {
	case errors.As(err, &refused), errors.As(err, &netErr) && netErr.Op == "dial":
		return err // an error reply, or no server at all
	case opts.TLSConfig != nil:
		return fmt.Errorf("%w (a rediss:// URL speaks TLS: is that port's server a TLS one?)", err)
	}
	return fmt.Errorf("%w (if that port's server wants TLS, use a rediss:// URL)", err)
}

// postgresConnector reads dsn (a postgres:// URL or key=value settings)
// without connecting: one that cannot be read is a mistake in the command
// line, reported before any service is touched.
func postgresConnector(dsn string) (*pq.Connector, error) {
	cfg, err := postgresConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pq.NewConnectorConfig(cfg)
}

// postgresConfig reads dsn. Without a connect_timeout of its own it gets
// connectTimeout: lib/pq ignores the context's deadline while it waits
// for the server's first answer, so a server that accepts the connection
// and never answers would hang the command for good.
func postgresConfig(dsn string) (pq.Config, error) {
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return pq.Config{}, usagef("--postgres: %v", redactDSN(err, dsn))
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	return cfg, nil
}

// openPostgres opens dsn and checks the database answers.
func openPostgres(ctx context.Context, dsn string) (*sql.DB, error) {
	conn, err := postgresConnector(dsn)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("postgres does not answer: %w", redactDSN(err, dsn))
	}
	return db, nil
}

// redactDSN keeps a password in dsn out of an error message.
func redactDSN(err error, dsn string) error {
	if i := strings.Index(dsn, "://"); i >= 0 {
		if at := strings.LastIndex(dsn, "@"); at > i {
			if colon := strings.Index(dsn[i+3:at], ":"); colon >= 0 {
				pw := dsn[i+3+colon+1 : at]
				if pw != "" && strings.Contains(err.Error(), pw) {
					return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
				}
			}
		}
	}
	return err
}

// keyArgs reads SCOPE ID from the positional arguments.
func keyArgs(fs *flag.FlagSet) (guard.Key, error) {
	if fs.NArg() != 2 {
		return guard.Key{}, usagef("want SCOPE and ID, got %d arguments", fs.NArg())
	}
	k := guard.Key{Scope: fs.Arg(0), ID: fs.Arg(1)}
	if err := k.Validate(); err != nil {
		return guard.Key{}, usagef("%v", err)
	}
	return k, nil
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect")
	rf := addRedisFlags(fs)
	pg := fs.String("postgres", "", "also read the key's row from this PostgreSQL URL (the SQL backstop; a gateway's fallback, the gateway named by --prefix)")
	schema := fs.String("schema", "", "PostgreSQL schema of the backstop tables (default: the search_path)")
	tablePrefix := addTablePrefixFlag(fs)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *schema != "" && *pg == "" {
		return usagef("--schema needs --postgres")
	}
	if *tablePrefix != "" && *tablePrefix != pgstore.DefaultTablePrefix && *pg == "" {
		return usagef("--table-prefix needs --postgres")
	}
	if fs.NArg() == 1 && strings.HasPrefix(fs.Arg(0), *rf.prefix+"{") {
		// The Redis key `list` shows: a completed record keeps no scope
		// and ID, so its name is all an operator has.
		if *pg != "" {
			return usagef("--postgres finds a row by SCOPE ID, not by the Redis key %s (a digest of them)", fs.Arg(0))
		}
		return inspectByName(ctx, rf, fs.Arg(0), stdout)
	}
	if fs.NArg() != 2 {
		return usagef("want SCOPE and ID, or a Redis key as idemguard list shows it (%s{…}), got %d arguments", *rf.prefix, fs.NArg())
	}
	key, err := keyArgs(fs)
	if err != nil {
		return err
	}
	if *pg != "" {
		if _, err := postgresConnector(*pg); err != nil {
			return err
		}
	}
	// With --postgres, a Redis that does not answer or a record it holds
	// that cannot be read does not hide the row: during an outage the
	// row a fallback or the backstop keeps is the key's one record. The
	// command still fails, naming Redis, once the row is shown. Nor does
	// a PostgreSQL that does not answer hide the Redis record (the
	// command then fails naming PostgreSQL).
	if *pg != "" {
		if err := (pgstore.Options{Schema: *schema, TablePrefix: *tablePrefix}).Validate(); err != nil {
			return usagef("%v", err)
		}
	}
	c, store, redisFailed := rf.open(ctx)
	var ue usageError
	switch {
	case redisFailed == nil:
		defer c.Close()
	case *pg == "" || errors.As(redisFailed, &ue):
		return redisFailed
	}
	var pgStore *pgstore.Store
	var pgFailed error
	if *pg != "" {
		db, err := openPostgres(ctx, *pg)
		if err != nil {
			pgFailed = err
		} else {
			defer db.Close()
			if pgStore, err = pgstore.New(db, pgstore.Options{Schema: *schema, TablePrefix: *tablePrefix}); err != nil {
				return usagef("%v", err)
			}
		}
	}

	var rec guard.Record
	err = redisFailed
	if store != nil {
		rec, err = store.Get(ctx, key)
	}
	found := err == nil
	switch {
	case errors.Is(err, guard.ErrNotFound):
		fmt.Fprintf(stdout, "redis %s: no record for %s\n", *rf.shown, shown(key.String()))
	case err != nil && *pg == "":
		return fmt.Errorf("read %s from redis: %w", key, err)
	case err != nil:
		if redisFailed == nil {
			redisFailed = fmt.Errorf("read %s from redis: %w", key, err)
		}
		fmt.Fprintf(stdout, "redis %s: not read: %s\n", *rf.shown, oneLine(redisFailed.Error()))
	default:
		name := store.Name(key)
		fmt.Fprintf(stdout, "redis %s  %s\n", *rf.shown, shown(name))
		printRecord(stdout, rec)
	}
	if pgStore != nil {
		prec, err := pgStore.Get(ctx, key)
		switch {
		case errors.Is(err, guard.ErrNotFound):
		case err != nil:
			return fmt.Errorf("read %s from postgres: %w", key, err) // a missing table says how to make it
		default:
			found = true
			fmt.Fprintln(stdout, "postgres")
			printRecord(stdout, prec)
		}
		// A gateway's fallback PostgreSQL keeps its keys under its Redis
		// prefix (gateway.SecondaryScope): --prefix names the gateway.
		gwKey := guard.Key{Scope: gateway.SecondaryScope(*rf.prefix, key.Scope), ID: key.ID}
		grec, gerr := pgStore.Get(ctx, gwKey)
		switch {
		case errors.Is(gerr, guard.ErrNotFound):
		case gerr != nil:
			return fmt.Errorf("read %s from postgres: %w", gwKey, gerr)
		default:
			found = true
			fmt.Fprintf(stdout, "postgres (the fallback of the gateway with redis.prefix %s)\n", strconv.Quote(*rf.prefix))
			printRecord(stdout, grec)
		}
		if errors.Is(err, guard.ErrNotFound) && errors.Is(gerr, guard.ErrNotFound) {
			fmt.Fprintf(stdout, "postgres: no row for %s (nor for it in the fallback of a gateway with redis.prefix %s)\n", shown(key.String()), strconv.Quote(*rf.prefix))
		}
	}
	if pgFailed != nil {
		fmt.Fprintf(stdout, "postgres: not read: %s\n", oneLine(pgFailed.Error()))
	}
	if redisFailed != nil {
		return redisFailed
	}
	if pgFailed != nil {
		return pgFailed
	}
	if !found {
		return fmt.Errorf("no record for %s", key)
	}
	return nil
}

// inspectByName shows the record under the Redis key name, as `list`
// prints it.
func inspectByName(ctx context.Context, rf redisFlags, name string, stdout io.Writer) error {
	c, store, err := rf.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	rec, err := store.GetByName(ctx, name)
	switch {
	case errors.Is(err, guard.ErrNotFound):
		fmt.Fprintf(stdout, "redis %s: no record under %s\n", *rf.shown, shown(name))
		return fmt.Errorf("no record under %s", name)
	case err != nil:
		return fmt.Errorf("read %s from redis: %w", name, err)
	}
	fmt.Fprintf(stdout, "redis %s  %s\n", *rf.shown, shown(name))
	printRecord(stdout, rec)
	return nil
}

// shown is s as the operator's terminal may show it: text read from the
// store (a failure's reason, a key, a Redis key name) is anyone's, and a
// control character, an escape sequence, a bidirectional override or a
// byte of invalid UTF-8 in it is written as a Go escape (\x1b, \n,
// \u202e), never sent raw for the terminal to obey. A backslash is
// written \\, so that a key holding the text of an escape (`a\u00a0b`) is
// not shown as the key holding the character (`a`, U+00A0, `b`): what is
// shown reads back as the text in Go's quoting or bash's $'…'.
func shown(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && w == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += w
	}
	return b.String()
}

func printRecord(w io.Writer, r guard.Record) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	lease := "none"
	switch {
	case r.State == guard.StatePending && r.LeaseLeft > 0:
		lease = r.LeaseLeft.Round(time.Millisecond).String()
	case r.State == guard.StatePending:
		lease = "expired (the next claim recovers the key)"
	}
	ttl := "unknown"
	if r.TTL > 0 {
		ttl = r.TTL.Round(time.Second).String()
	}
	if r.Key == (guard.Key{}) {
		fmt.Fprintf(tw, "  scope, id\tnot kept (a completed record keeps neither)\n")
	} else {
		fmt.Fprintf(tw, "  scope\t%s\n", shown(r.Key.Scope))
		fmt.Fprintf(tw, "  id\t%s\n", shown(r.Key.ID))
	}
	fmt.Fprintf(tw, "  state\t%s\n", r.State)
	fmt.Fprintf(tw, "  fence\t%d\n", r.Fence)
	fmt.Fprintf(tw, "  attempts\t%d\n", r.Attempt)
	fmt.Fprintf(tw, "  recovered\t%t\n", r.Recovered)
	fmt.Fprintf(tw, "  lease left\t%s\n", lease)
	fmt.Fprintf(tw, "  expires in\t%s\n", ttl)
	fmt.Fprintf(tw, "  result size\t%d bytes\n", len(r.Result))
	if len(r.Steps) > 0 {
		// The steps stored, in order: the next attempt resumes after them.
		steps := make([]string, len(r.Steps))
		for i, st := range r.Steps {
			steps[i] = fmt.Sprintf("%s (%d bytes)", shown(st.Name), len(st.Result))
		}
		fmt.Fprintf(tw, "  steps\t%s\n", strings.Join(steps, ", "))
	}
	if r.LastError != "" {
		fmt.Fprintf(tw, "  last error\t%s\n", shown(r.LastError))
	}
	_ = tw.Flush()
}

func runList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list")
	rf := addRedisFlags(fs)
	stateName := fs.String("state", "pending", "records in this state: pending, completed or failed")
	limit := fs.Int("limit", 1000, "list at most this many keys (0: no limit)")
	format := fs.String("format", "table", "table (columns aligned a block of "+strconv.Itoa(listBlock)+" rows at a time, written as the scan goes; scope and id escaped: for people) or json (one object per line with the exact scope and id: for scripts)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *format != "table" && *format != "json" {
		return usagef("--format %q: want table or json", *format)
	}
	state, ok := guard.ParseState(*stateName)
	if !ok {
		return usagef("--state %q: want pending, completed or failed", *stateName)
	}
	if *limit < 0 {
		return usagef("--limit %d must not be negative", *limit)
	}
	c, store, err := rf.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()

	// The table goes out a block of listBlock rows at a time, each
	// aligned on its own: a tabwriter holds every row until it is
	// flushed, and a list over a large keyspace would show nothing until
	// the scan ended, hold every row in memory, and lose them all to a
	// Ctrl-C.
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	defer tw.Flush() // what was listed before an error or a Ctrl-C
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if *format == "table" {
		fmt.Fprintln(tw, "SCOPE\tID\tSTATE\tFENCE\tATTEMPTS\tLEASE LEFT\tREDIS KEY")
	}
	n, scanned, unreadable := 0, 0, 0
	limited := false
	var firstBad, werr error
	// The names listed (or found unreadable): SCAN gives a name again when
	// the server's table of keys shrinks during the scan, as it does when
	// many records expire meanwhile (ScanRecords), and a record is listed
	// once. As many as the rows listed are kept, not every name scanned.
	given := map[string]struct{}{}
	err = store.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
		scanned++
		if _, again := given[name]; again {
			return true
		}
		switch {
		case err != nil:
			given[name] = struct{}{}
			unreadable++
			if firstBad == nil {
				firstBad = err
			}
			return true
		case rec.State != state:
			return true
		case *limit > 0 && n >= *limit:
			limited = true // one more than the limit
			return false
		}
		given[name] = struct{}{}
		n++
		if *format == "json" {
			werr = enc.Encode(listedOf(name, rec))
			return werr == nil
		}
		lease := "-"
		if rec.State == guard.StatePending {
			lease = "expired"
			if rec.LeaseLeft > 0 {
				lease = rec.LeaseLeft.Round(time.Millisecond).String()
			}
		}
		// A completed record keeps no scope and ID: its Redis key is a
		// digest of them (idemguard inspect SCOPE ID finds it).
		scope, id := rec.Key.Scope, rec.Key.ID
		if rec.Key == (guard.Key{}) {
			scope, id = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", shown(scope), shown(id), rec.State, rec.Fence, rec.Attempt, lease, shown(name))
		if n%listBlock == 0 {
			werr = tw.Flush()
		}
		return werr == nil
	})
	if err != nil {
		return fmt.Errorf("scan %s (%d %s keys listed of %d records scanned): %w", *rf.shown, n, state, scanned, err)
	}
	if werr != nil {
		return fmt.Errorf("write the list: %w", werr)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the list: %w", err)
	}
	fmt.Fprintf(stderr, "%d %s keys (of %d records scanned)\n", n, state, scanned)
	if limited {
		fmt.Fprintf(stderr, "stopped at --limit %d: there are more %s keys; --limit 0 lists them all\n", *limit, state)
	}
	if scanned == 0 {
		// Most often a guard given another RedisOptions.Prefix.
		fmt.Fprintf(stderr, "no idemguard records under %s* on %s: if the guard has keys, give its RedisOptions.Prefix with --prefix\n", *rf.prefix, *rf.shown)
	}
	if unreadable > 0 {
		// A failure a script must notice: a stuck key may be among them.
		return fmt.Errorf("%d records could not be read (corrupt, or kept by another idemguard version); the first: %w", unreadable, firstBad)
	}
	return nil
}

// listBlock is how many rows of list's table are aligned together and
// written at once.
const listBlock = 100

// listedRecord is one line of list --format json: the record's exact
// scope and id (absent for a completed record, which keeps neither),
// state, fence, attempts, the holder's lease left in milliseconds (0 when
// it ran out, and for a record that is not pending) and its Redis key:
// redis_key, and when the name is not UTF-8 (a prefix of other bytes),
// which a JSON string cannot carry, redis_key_base64 with its exact bytes.
type listedRecord struct {
	Scope       *string `json:"scope,omitempty"`
	ID          *string `json:"id,omitempty"`
	State       string  `json:"state"`
	Fence       int64   `json:"fence"`
	Attempts    int     `json:"attempts"`
	LeaseLeftMS int64   `json:"lease_left_ms"`
	RedisKey    string  `json:"redis_key"`
	RedisKey64  string  `json:"redis_key_base64,omitempty"`
}

func listedOf(name string, rec guard.Record) listedRecord {
	l := listedRecord{State: rec.State.String(), Fence: rec.Fence, Attempts: rec.Attempt, RedisKey: name}
	if !utf8.ValidString(name) {
		l.RedisKey64 = base64.StdEncoding.EncodeToString([]byte(name))
	}
	if rec.Key != (guard.Key{}) {
		l.Scope, l.ID = &rec.Key.Scope, &rec.Key.ID
	}
	if rec.State == guard.StatePending && rec.LeaseLeft > 0 {
		l.LeaseLeftMS = max(rec.LeaseLeft.Milliseconds(), 1)
	}
	return l
}

func runRelease(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("release")
	rf := addRedisFlags(fs)
	force := fs.Bool("force", false, "release even though the holder's lease is still alive: it may still be running, and its effect happen twice unless downstream writes check the fence")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	key, err := keyArgs(fs)
	if err != nil {
		return err
	}
	c, store, err := rf.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	rec, err := store.Get(ctx, key)
	if errors.Is(err, guard.ErrNotFound) {
		return fmt.Errorf("no record for %s", key)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	switch rec.State {
	case guard.StateCompleted:
		return fmt.Errorf("%s is completed (fence %d): its effect happened, releasing it would let it run again; refusing", key, rec.Fence)
	case guard.StateFailed:
		fmt.Fprintf(stdout, "%s is failed (attempt %d): no holder has it, the next claim retries it unless its guard's MaxAttempts are spent; nothing to do\n", shown(key.String()), rec.Attempt)
		return nil
	}
	if rec.LeaseLeft > 0 && !*force {
		return fmt.Errorf("%s is pending and its holder's lease is alive for %s: it may still be running; wait, or use --force", key, rec.LeaseLeft.Round(time.Millisecond))
	}
	if rec.TTL <= 0 {
		return fmt.Errorf("%s is pending without an expiry, which idemguard never writes; nothing done", key)
	}
	// Not the holder's Release: that undoes a first attempt as if it was
	// never made, and the next claim would get the freed holder's fence
	// again (docs/design.md, rule 4), though it may still be running. The
	// holder's attempt fails instead, as a lease that ran out: its later
	// writes are refused and the next claim takes over with fence+1.
	// Redis checks again as it writes, in one script: the record must
	// still be this holder's pending one, and without --force its lease
	// still run out (the holder may have come back and extended it since
	// the read above).
	if err := store.FailHolder(ctx, guard.Lease{Key: key, Token: rec.Token}, releaseReason, rec.TTL, *force); err != nil {
		var alive *guard.InProgressError
		if errors.As(err, &alive) {
			return fmt.Errorf("%s is pending and its holder's lease is alive again (extended meanwhile) for %s: it may still be running; nothing done; wait, or use --force", key, alive.RetryAfter.Round(time.Millisecond))
		}
		if errors.Is(err, guard.ErrLeaseLost) {
			return fmt.Errorf("%s changed while releasing (its holder ended it, or another holder took it); nothing done", key)
		}
		if strings.Contains(err.Error(), "READONLY") {
			return fmt.Errorf("release %s: --redis %s is a replica: give its master (%w)", key, *rf.shown, err)
		}
		return fmt.Errorf("release %s: %w", key, err)
	}
	if rec.LeaseLeft > 0 {
		fmt.Fprintf(stderr, "warning: %s: its holder's lease was alive for %s: it may still be running, and its effect may then happen twice unless downstream writes check Lease.Fence or the backstop\n",
			shown(key.String()), rec.LeaseLeft.Round(time.Millisecond))
	}
	fmt.Fprintf(stdout, "released %s: its attempt %d (fence %d) is failed, its holder's later writes are refused; the next claim takes it over with fence %d (a key at its guard's MaxAttempts is exhausted)\n",
		shown(key.String()), rec.Attempt, rec.Fence, rec.Fence+1)
	return nil
}

// releaseReason is the failure release records for the holder it frees:
// the next holder and a dead letter see it as the last error.
const releaseReason = "released by an operator (idemguard release): the holder may have run part of its effect"
