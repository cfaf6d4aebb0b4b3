package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/scripts"
)

var _ BatchStore = (*RedisStore)(nil)

// ClaimBatch implements BatchStore. The claims go out as one pipeline of
// SET NX GET, Claim's native command, one per key: it creates every fresh
// key's record and returns every existing one, which the client answers
// from as Claim does (a replay, a mismatch, this claim sent again). Only
// the keys whose record needs the server's decision (another holder's
// pending record, a failed or a released one, or every key on a server
// out of memory) take a second round trip: one pipeline of the claim
// script. A pipeline of native commands costs Redis a fraction of one
// script run over all the keys, and each key's command stays the atomic,
// repeatable compare-and-set Claim sends. On a Cluster, go-redis splits
// each pipeline by node and routes each command by its key's hash tag.
func (s *RedisStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Outcome, []error) {
	n := len(reqs)
	out, errs := make([]Outcome, n), make([]error, n)
	// A key's claim: 320 bytes (416 before its token, its command, its
	// size and its pendingValue, whose buffer is value and whose ttl is
	// px, were left out: a batch of 16 took 6784 bytes, now 5376). Its
	// command is the next of cmds.
	type claimCall struct {
		setCall
		// fp, tok, key: where value holds the fingerprint, the token and
		// the key, encoded; body: where its body starts (pendingValue's).
		fp, tok, key [2]int32
		body         int32
		retention    int64        // ms
		raw          redis.RawCmd // the command on a *redis.Client, made in place
	}
	piece := func(c *claimCall, at [2]int32) string { return c.value[at[0]:at[1]] }
	calls := make([]claimCall, n)
	cmds := make([]redis.Cmder, 0, n)
	// Every key's name and first attempt share one allocation.
	total := 0
	for i := range reqs {
		var size int
		if size, errs[i] = pendingLen(reqs[i]); errs[i] == nil {
			total += s.nameLen() + size
		}
	}
	mem := make([]byte, 0, total)
	for i := range reqs {
		if errs[i] != nil {
			continue
		}
		// The key's record goes after the ones before it, within the
		// room pendingLen counted: appending never moves mem.
		off := len(mem)
		p, buf := appendPending(mem[off:off+s.nameLen()], reqs[i])
		s.appendName(buf[:0], reqs[i].Key)
		mem = mem[:off+len(buf)]
		all := unsafeString(buf)
		c := &calls[i]
		c.name, c.value, c.px = all[:s.nameLen()], all[s.nameLen():], p.ttl
		c.fp, c.tok, c.key = [2]int32{int32(p.fp[0]), int32(p.fp[1])}, [2]int32{int32(p.tok[0]), int32(p.tok[1])}, [2]int32{int32(p.key[0]), int32(p.key[1])}
		c.body, c.retention = int32(p.body), p.retention
		c.args = [...]any{"set", &c.name, &c.value, "nx", "get", "px", &c.px}
		if s.raw {
			c.raw = *redis.NewRawCmd(ctx, c.args[:]...)
			cmds = append(cmds, &c.raw)
		} else {
			cmds = append(cmds, redis.NewStringCmd(ctx, c.args[:]...))
		}
	}
	s.exec(ctx, cmds)

	var again []int // keys for the claim script
	for i, k := 0, 0; i < len(reqs); i++ {
		if errs[i] != nil {
			continue
		}
		c := &calls[i]
		cmd := cmds[k] // the commands are in the order of the keys sent
		k++
		v, found, owned, err := setReply(cmd)
		tok := piece(c, c.tok)
		switch {
		case refusesWrites(err):
			again = append(again, i) // the script reads first: see Claim
			continue
		case err != nil:
			errs[i] = s.callErr(ctx, reqs[i].Key, c.name, err)
			continue
		case !found:
			out[i] = acquired(&reqs[i], c.name, tok, 1, 1, false, c.value, int(c.body))
			continue
		}
		o, ok, err := answerFound(&reqs[i], c.name, tok, piece(c, c.fp), v, owned)
		if !ok {
			again = append(again, i)
			continue
		}
		out[i], errs[i] = o, err
	}
	if len(again) == 0 {
		return out, errs
	}

	args := make([][10]any, len(again))
	replies := s.scripts(ctx, len(again), func(j int) (*redis.Script, []any) {
		i := again[j]
		r, c := &reqs[i], &calls[i]
		args[j] = [...]any{evalsha, nil, 1, c.name, piece(c, c.tok), piece(c, c.fp), ms(r.Lease), c.retention, r.MaxAttempts, piece(c, c.key)}
		return scripts.Claim, args[j][:]
	})
	for j, i := range again {
		r, c := &reqs[i], &calls[i]
		reply, err := replies[j].(*redis.Cmd).Slice()
		if err != nil {
			errs[i] = s.callErr(ctx, r.Key, c.name, err)
			continue
		}
		o, err := decodeClaim(reply)
		if err == nil && o.Status == Acquired {
			l := o.Lease
			o = acquired(r, c.name, piece(c, c.tok), l.Fence, int64(l.Attempt), l.Recovered, l.names.pending, l.names.body)
		}
		out[i], errs[i] = o, err
	}
	return out, errs
}

// setReply reads the answer to a claim's SET NX GET as setNXGet does.
func setReply(cmd redis.Cmder) (v string, found, owned bool, err error) {
	switch c := cmd.(type) {
	case *redis.RawCmd:
		if err := c.Err(); err != nil {
			return "", false, false, err
		}
		v, found, err = parseBulk(c.Val())
		return v, found, true, err
	case *redis.StringCmd:
		switch err := c.Err(); {
		case err == redis.Nil:
			return "", false, false, nil
		case err != nil:
			return "", false, false, err
		}
		return c.Val(), true, false, nil
	}
	return "", false, false, fmt.Errorf("%w: reply of type %T", ErrCorrupt, cmd)
}

// WriteBatch implements BatchStore: one pipeline of the write scripts
// (complete, fail, release, extend: the scripts Complete, Fail, Release
// and Extend send, one per key). A completion whose lease knows the
// pending record its claim left is built by the client, as Complete's,
// and the completions of keys that may share a script call (every key on
// a standalone server, the keys of one slot on a Cluster) go as one run
// of scripts.CompleteBatch: per key, complete.lua's first comparison and
// write. A key it does not complete (its record is no longer the pending
// record its claim left: extended, taken over, completed already, gone)
// gets complete.lua in a second round trip, which gives the answer
// Complete would. One script call for 16 completions instead of 16 took
// the idemguard bench consumer row from 82 to 67 Redis commands per batch
// of 16, and its Redis CPU from 189–201 to 160–181 µs in alternated runs
// beside other work (181 → 174 µs between two quiet runs a day apart);
// the script's GET and SET per key, not the call, are most of what is
// left.
func (s *RedisStore) WriteBatch(ctx context.Context, ws []Write) []error {
	errs := make([]error, len(ws))
	calls := make([]batchWrite, len(ws))
	// The completed records of the batch share one allocation.
	size := 0
	for i := range ws {
		if ws[i].Kind == WriteComplete {
			size += len(ws[i].Lease.names.pending) + maxUvarintLen + len(ws[i].Result)
		}
	}
	buf := make([]byte, 0, size)
	for i := range ws {
		w, c := &ws[i], &calls[i]
		n, err := s.leaseNames(w.Lease)
		if err != nil {
			errs[i] = err
			continue
		}
		c.name, c.tok = n.name, n.tok
		if k := w.Kind; k == WriteComplete || k == WriteFail || k == WriteExtend {
			if errs[i] = positive(w.Kind.String(), w.Lease.Key, durationName(w.Kind), w.TTL); errs[i] != nil {
				continue
			}
		}
		switch w.Kind {
		case WriteComplete:
			c.ms, c.pending = ms(w.TTL), n.pending
			start := len(buf)
			if n.pending != "" {
				buf = appendCompleted(buf, n.pending, n.body, w.Result)
				c.body = int64(n.body)
			} else {
				buf = append(appendUvarint(buf, int64(len(w.Result))), w.Result...)
			}
			c.result.b = buf[start:len(buf):len(buf)]
		case WriteFail:
			c.reason, c.ms = w.Reason, ms(w.TTL)
		case WriteRelease:
		case WriteExtend:
			c.ms = ms(w.TTL)
		default:
			errs[i] = fmt.Errorf("idemguard: unknown write kind %d", w.Kind)
		}
	}

	// What goes out: each write by its own script, but the completions
	// of a group, which go by one CompleteBatch at the place of the
	// group's first write.
	var idxMem [32]int
	var groupsMem [1][]int
	groups := s.completeGroups(ws, calls, errs, idxMem[:0], groupsMem[:0])
	type job struct {
		i    int     // the write, when g is nil
		g    []int   // the writes of a CompleteBatch
		args []any   // a CompleteBatch's arguments
		one  *[9]any // a write's own: room for its arguments
	}
	var jobsMem [32]job
	jobs := jobsMem[:0]
	ones := 0 // jobs of one write
	var small [64]bool
	grouped := small[:0]
	if len(groups) > 0 {
		if len(ws) <= len(small) {
			grouped = small[:len(ws)]
		} else {
			grouped = make([]bool, len(ws))
		}
		for _, g := range groups {
			for _, i := range g {
				grouped[i] = true
			}
		}
	}
	for i, gi := 0, 0; i < len(ws); i++ {
		switch {
		case gi < len(groups) && groups[gi][0] == i:
			jobs = append(jobs, job{g: groups[gi], args: completeBatchArgs(groups[gi], calls)})
			gi++
		case errs[i] == nil && (len(grouped) == 0 || !grouped[i]):
			jobs = append(jobs, job{i: i})
			ones++
		}
	}
	if ones > 0 {
		// The writes that go by a script of their own share one slab of
		// arguments.
		room := make([][9]any, 0, ones)
		for j := range jobs {
			if jobs[j].g == nil {
				room = append(room, [9]any{})
				jobs[j].one = &room[len(room)-1]
			}
		}
	}
	replies := s.scripts(ctx, len(jobs), func(j int) (*redis.Script, []any) {
		if jb := &jobs[j]; jb.g != nil {
			return scripts.CompleteBatch, jb.args
		}
		return writeScript(&ws[jobs[j].i], &calls[jobs[j].i], jobs[j].one)
	})
	var again []int // the completions CompleteBatch left to complete.lua
	for j, jb := range jobs {
		switch {
		case jb.g == nil:
			errs[jb.i] = s.wrote(ctx, &ws[jb.i], &calls[jb.i], replies[j])
		default:
			again = s.completedBatch(ctx, ws, calls, errs, jb.g, replies[j], again)
		}
	}
	if len(again) == 0 {
		return errs
	}
	room := make([][9]any, len(again))
	replies = s.scripts(ctx, len(again), func(j int) (*redis.Script, []any) {
		return writeScript(&ws[again[j]], &calls[again[j]], &room[j])
	})
	for j, i := range again {
		errs[i] = s.wrote(ctx, &ws[i], &calls[i], replies[j])
	}
	return errs
}

// maxCompleteBatch bounds the keys of one CompleteBatch run, so that one
// script does not hold Redis for long.
const maxCompleteBatch = 64

// completeGroups returns the groups of writes that go by one
// CompleteBatch each, in the order of their first writes: completions
// whose lease knows the pending record its claim left (the script's fast
// path), at least two to a group, all in one Cluster slot on a Cluster.
// On a client that is neither a *redis.Client nor a *redis.ClusterClient
// (a Ring spreads keys over servers), or in a batch that names a key
// twice, there are none.
//
// idx and groups are room for the answer.
func (s *RedisStore) completeGroups(ws []Write, calls []batchWrite, errs []error, idx []int, groups [][]int) [][]int {
	var cluster bool
	switch s.client.(type) {
	case *redis.Client:
	case *redis.ClusterClient:
		cluster = true
	default:
		return nil
	}
	for i := range ws {
		if errs[i] == nil && ws[i].Kind == WriteComplete && calls[i].pending != "" {
			idx = append(idx, i)
		}
	}
	if len(idx) < 2 || !uniqueNames(calls, errs) {
		return nil
	}
	add := func(g []int) {
		for len(g) >= 2 {
			n := min(len(g), maxCompleteBatch)
			groups = append(groups, g[:n:n])
			g = g[n:]
		}
	}
	if !cluster {
		add(idx)
		return groups
	}
	slots := make([]uint16, len(ws))
	for _, i := range idx {
		slots[i] = keySlot(calls[i].name)
	}
	slices.SortStableFunc(idx, func(a, b int) int { return int(slots[a]) - int(slots[b]) })
	for start := 0; start < len(idx); {
		end := start + 1
		for end < len(idx) && slots[idx[end]] == slots[idx[start]] {
			end++
		}
		add(idx[start:end])
		start = end
	}
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	return groups
}

// uniqueNames reports whether the writes that go out name each record
// once (BatchStore's contract: a batch that does not is sent one script
// per write, in its order).
func uniqueNames(calls []batchWrite, errs []error) bool {
	if len(calls) <= 64 {
		for i := range calls {
			for j := i + 1; j < len(calls); j++ {
				if errs[i] == nil && errs[j] == nil && calls[i].name == calls[j].name {
					return false
				}
			}
		}
		return true
	}
	seen := make(map[string]struct{}, len(calls))
	for i := range calls {
		if errs[i] != nil {
			continue
		}
		if _, ok := seen[calls[i].name]; ok {
			return false
		}
		seen[calls[i].name] = struct{}{}
	}
	return true
}

// completeBatchArgs is the arguments of the CompleteBatch of the writes
// g: {evalsha, nil, len(g), their records' names, then per write the
// pending record, the completed record and the retention in ms}.
func completeBatchArgs(g []int, calls []batchWrite) []any {
	args := make([]any, 3, 3+4*len(g))
	args[2] = len(g)
	for _, i := range g {
		args = append(args, &calls[i].name)
	}
	for _, i := range g {
		c := &calls[i]
		args = append(args, &c.pending, &c.result, &c.ms)
	}
	return args
}

// completedBatch reads the reply of the CompleteBatch of the writes g:
// a write it completed has no error; the others are appended to again,
// for complete.lua. A reply the server gave as an error (the script
// refused, a slot moving) sends them all to complete.lua, which is safe
// whatever the script did; a failed connection is every write's error.
func (s *RedisStore) completedBatch(ctx context.Context, ws []Write, calls []batchWrite, errs []error, g []int, reply redis.Cmder, again []int) []int {
	v, err := reply.(*redis.Cmd).Result()
	if err != nil && !isServerError(err) {
		for _, i := range g {
			errs[i] = s.callErr(ctx, ws[i].Lease.Key, calls[i].name, err)
		}
		return again
	}
	vals, ok := v.([]any)
	if err != nil || !ok || len(vals) != len(g) {
		return append(again, g...)
	}
	for k, i := range g {
		if n, ok := vals[k].(int64); !ok || n != 1 {
			again = append(again, i)
		}
	}
	return again
}

// isServerError reports whether err is a reply of the server's (an
// error reply), not a failed connection.
func isServerError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// durationName names what a Write's TTL is for its kind.
func durationName(k WriteKind) string {
	if k == WriteExtend {
		return "lease"
	}
	return "ttl"
}

// batchWrite is what the script of one write of a WriteBatch is sent
// with. Unlike writeCall, it holds no command and no list of arguments:
// a completion that goes by a CompleteBatch needs neither, and the writes
// that go by a script of their own take theirs from one slab
// (writeScript): 104 bytes a write instead of 368, and 144 more for one
// sent by a script of its own (go test -bench Consume in
// consumerx/redisstream: 4280 → 4006 bytes allocated per guarded message).
type batchWrite struct {
	name, tok, reason, pending string
	result                     bytesArg
	ms, body                   int64
}

// writeScript is the script and arguments of w, whose call c is set up;
// the arguments are made in args, and are the same each time.
func writeScript(w *Write, c *batchWrite, args *[9]any) (*redis.Script, []any) {
	args[2], args[3], args[4] = 1, &c.name, &c.tok
	switch w.Kind {
	case WriteComplete:
		args[5], args[6], args[7], args[8] = &c.ms, &c.pending, &c.result, &c.body
		return scripts.Complete, args[:9]
	case WriteFail:
		args[5], args[6] = &c.reason, &c.ms
		return scripts.Fail, args[:7]
	case WriteRelease:
		return scripts.Release, args[:5]
	default:
		args[5] = &c.ms
		return scripts.Extend, args[:6]
	}
}

// wrote reads the answer of a write script: 1 (OK) or 0 (LOST).
func (s *RedisStore) wrote(ctx context.Context, w *Write, c *batchWrite, reply redis.Cmder) error {
	v, err := reply.(*redis.Cmd).Int64()
	switch {
	case err != nil:
		return s.callErr(ctx, w.Lease.Key, c.name, err)
	case v != 1:
		return ErrLeaseLost
	}
	return nil
}

// scripts runs n scripts in one pipeline: script(j) gives the j-th, with
// its arguments {evalsha, nil, number of keys, keys..., ARGV...} (the
// first two slots are filled in here). Scripts the server does not have
// (a restarted or flushed server) are sent again by EVAL, in a second
// pipeline. script must give the same answer each time it is asked. Each
// command holds its answer or error.
func (s *RedisStore) scripts(ctx context.Context, n int, script func(j int) (*redis.Script, []any)) []redis.Cmder {
	cmds := make([]redis.Cmder, n)
	mem := make([]redis.Cmd, n) // the commands, made in place: one allocation
	for j := range n {
		sc, args := script(j)
		args[0], args[1] = evalsha, scriptHash(s.variant(sc))
		mem[j] = *redis.NewCmd(ctx, args...)
		mem[j].SetFirstKeyPos(3)
		cmds[j] = &mem[j]
	}
	s.exec(ctx, cmds)
	// Scripts the server does not have go by EVAL; then, on a server that
	// refused a flag line (miniredis), those scripts once more, plain.
	for _, retry := range []func(sc *redis.Script, err error) (*redis.Script, bool){
		func(sc *redis.Script, err error) (*redis.Script, bool) { return s.variant(sc), isNoScript(err) },
		func(sc *redis.Script, err error) (*redis.Script, bool) {
			return scripts.Plain(sc), s.flagsRefused(sc, err)
		},
	} {
		var again []redis.Cmder
		for j, cmd := range cmds {
			if cmd.Err() == nil {
				continue
			}
			sc, args := script(j)
			if sc, ok := retry(sc, cmd.Err()); ok {
				cmds[j] = evalCmd(ctx, sc, args)
				again = append(again, cmds[j])
			}
		}
		s.exec(ctx, again)
	}
	return cmds
}

// exec sends cmds together, as a pipeline of their own (on a Cluster, one
// per node); each command then holds its own answer or error. A batch
// never goes through the client's autopipeliner, even beside other calls:
// go-redis (v9.23) holds a flush there until the callers a completed
// pipeline woke have sent their next commands, and a batch's callers do
// not send theirs until their effects have run, so concurrent batches
// waited out its silence gap on every round trip. On their own pipelines,
// 16 Redis Streams consumers went from 0.19x to 0.31x the plain loop with
// less CPU per message on both sides (consumerx BenchmarkConsume; README,
// "Consumers in batches"; design.md, Pipelining). The call still counts
// as under way, for send.
func (s *RedisStore) exec(ctx context.Context, cmds []redis.Cmder) {
	if len(cmds) == 0 {
		return
	}
	if s.pipe != nil {
		s.inflight.Add(1)
		defer s.inflight.Add(-1)
	}
	pipe := s.client.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	_, _ = pipe.Exec(ctx)
}

// keySlot is the Redis Cluster hash slot of the key name: CRC16 (XMODEM)
// of its hash tag (the bytes between the first '{' and the first '}' after
// it, when there are any), else of the whole name, modulo 16384.
func keySlot(name string) uint16 {
	for i := 0; i < len(name); i++ {
		if name[i] != '{' {
			continue
		}
		for j := i + 1; j < len(name); j++ {
			if name[j] == '}' {
				if j > i+1 {
					name = name[i+1 : j]
				}
				return crc16(name) & 16383
			}
		}
		break
	}
	return crc16(name) & 16383
}

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
