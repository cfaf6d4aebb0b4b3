package guard

import (
	"context"
	"fmt"

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
	type claimCall struct {
		setCall
		p    pendingValue
		tok  string
		cmd  redis.Cmder
		raw  redis.RawCmd // cmd on a *redis.Client, made in place
		size int
	}
	calls := make([]claimCall, n)
	cmds := make([]redis.Cmder, 0, n)
	// Every key's name and first attempt share one allocation.
	total := 0
	for i := range reqs {
		if calls[i].size, errs[i] = pendingLen(reqs[i]); errs[i] == nil {
			total += s.nameLen() + calls[i].size
		}
	}
	mem := make([]byte, 0, total)
	for i := range reqs {
		if errs[i] != nil {
			continue
		}
		off := len(mem)
		p, buf := appendPending(mem[off:off+s.nameLen():off+s.nameLen()+calls[i].size], reqs[i])
		s.appendName(buf[:0], reqs[i].Key)
		mem = mem[:off+len(buf)]
		all := unsafeString(buf)
		c := &calls[i]
		c.p, c.name, c.value, c.px = p, all[:s.nameLen()], all[s.nameLen():], p.ttl
		c.tok = c.value[p.tok[0]:p.tok[1]]
		c.args = [...]any{"set", &c.name, &c.value, "nx", "get", "px", &c.px}
		if s.raw {
			c.raw = *redis.NewRawCmd(ctx, c.args[:]...)
			c.cmd = &c.raw
		} else {
			c.cmd = redis.NewStringCmd(ctx, c.args[:]...)
		}
		cmds = append(cmds, c.cmd)
	}
	if err := s.exec(ctx, cmds); err != nil {
		for i := range reqs {
			if errs[i] == nil {
				errs[i] = storeErr(ctx, err)
			}
		}
		return out, errs
	}

	var again []int // keys for the claim script
	for i := range reqs {
		c := &calls[i]
		if c.cmd == nil {
			continue
		}
		v, found, owned, err := setReply(c.cmd)
		switch {
		case refusesWrites(err):
			again = append(again, i) // the script reads first: see Claim
			continue
		case err != nil:
			errs[i] = s.callErr(ctx, reqs[i].Key, c.name, err)
			continue
		case !found:
			out[i] = acquired(&reqs[i], c.name, c.tok, 1, 1, false, c.value, c.p.body)
			continue
		}
		o, ok, err := answerFound(&reqs[i], c.name, c.tok, c.value[c.p.fp[0]:c.p.fp[1]], v, owned)
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
	replies, err := s.scripts(ctx, len(again), func(j int) (*redis.Script, []any) {
		i := again[j]
		r, c := &reqs[i], &calls[i]
		args[j] = [...]any{evalsha, nil, 1, c.name, c.tok, c.p.fpEnc(), ms(r.Lease), c.p.retention, r.MaxAttempts, c.p.keyEnc()}
		return scripts.Claim, args[j][:]
	})
	for j, i := range again {
		r, c := &reqs[i], &calls[i]
		if err != nil {
			errs[i] = storeErr(ctx, err)
			continue
		}
		reply, err := replies[j].(*redis.Cmd).Slice()
		if err != nil {
			errs[i] = s.callErr(ctx, r.Key, c.name, err)
			continue
		}
		o, err := decodeClaim(reply)
		if err == nil && o.Status == Acquired {
			l := o.Lease
			o = acquired(r, c.name, c.tok, l.Fence, int64(l.Attempt), l.Recovered, l.names.pending, l.names.body)
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
// pending record its claim left is built by the client, as Complete's.
// (One script over all the batch's completions cost Redis more CPU per
// key than these scripts' fast path, measured with the consumer
// benchmarks: it is not used.)
func (s *RedisStore) WriteBatch(ctx context.Context, ws []Write) []error {
	errs := make([]error, len(ws))
	calls := make([]writeCall, len(ws))
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
		c.args[2], c.args[3], c.args[4] = 1, &c.name, &c.tok
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
			c.args[5], c.args[6], c.args[7], c.args[8] = &c.ms, &c.pending, &c.result, &c.body
		case WriteFail:
			c.reason, c.ms = w.Reason, ms(w.TTL)
			c.args[5], c.args[6] = &c.reason, &c.ms
		case WriteRelease:
		case WriteExtend:
			c.ms = ms(w.TTL)
			c.args[5] = &c.ms
		default:
			errs[i] = fmt.Errorf("idemguard: unknown write kind %d", w.Kind)
		}
	}
	var idx []int // the writes that go out, when some cannot
	for i := range ws {
		if errs[i] != nil {
			idx = make([]int, 0, len(ws))
			for j := range ws {
				if errs[j] == nil {
					idx = append(idx, j)
				}
			}
			break
		}
	}
	n := len(ws)
	write := func(j int) int { return j }
	if idx != nil {
		n, write = len(idx), func(j int) int { return idx[j] }
	}
	replies, err := s.scripts(ctx, n, func(j int) (*redis.Script, []any) {
		return writeScript(&ws[write(j)], &calls[write(j)])
	})
	for j := range n {
		i := write(j)
		if err != nil {
			errs[i] = storeErr(ctx, err)
			continue
		}
		errs[i] = s.wrote(ctx, &ws[i], &calls[i], replies[j])
	}
	return errs
}

// durationName names what a Write's TTL is for its kind.
func durationName(k WriteKind) string {
	if k == WriteExtend {
		return "lease"
	}
	return "ttl"
}

// writeScript is the script and arguments of w, whose call c is set up.
func writeScript(w *Write, c *writeCall) (*redis.Script, []any) {
	switch w.Kind {
	case WriteComplete:
		return scripts.Complete, c.args[:9]
	case WriteFail:
		return scripts.Fail, c.args[:7]
	case WriteRelease:
		return scripts.Release, c.args[:5]
	default:
		return scripts.Extend, c.args[:6]
	}
}

// wrote reads the answer of a write script: 1 (OK) or 0 (LOST).
func (s *RedisStore) wrote(ctx context.Context, w *Write, c *writeCall, reply redis.Cmder) error {
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
// pipeline. script must give the same answer each time it is asked. An
// error means ctx ended before the answers came (see exec): the commands
// must not be read.
func (s *RedisStore) scripts(ctx context.Context, n int, script func(j int) (*redis.Script, []any)) ([]redis.Cmder, error) {
	cmds := make([]redis.Cmder, n)
	mem := make([]redis.Cmd, n) // the commands, made in place: one allocation
	for j := range n {
		sc, args := script(j)
		args[0], args[1] = evalsha, scriptHash(s.variant(sc))
		mem[j] = *redis.NewCmd(ctx, args...)
		mem[j].SetFirstKeyPos(3)
		cmds[j] = &mem[j]
	}
	if err := s.exec(ctx, cmds); err != nil {
		return nil, err
	}
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
		if err := s.exec(ctx, again); err != nil {
			return nil, err
		}
	}
	return cmds, nil
}

// exec sends cmds together; each command then holds its own answer or
// error. A batch sent while no other call of the store is under way goes
// as a pipeline of its own (on a Cluster, one per node). One sent while
// others are, on a pipelined store, goes through the client's
// autopipeliner with theirs, so that concurrent batches share writes and
// reads: with 16 consumers that took a third off the client's CPU per
// message (consumerx BenchmarkConsume). The autopipeliner's answers are
// waited for no longer than ctx allows; if ctx ends first, exec returns
// its error and the commands must not be read (the autopipeliner may
// still fill them in, and they may still run, as after any lost reply).
func (s *RedisStore) exec(ctx context.Context, cmds []redis.Cmder) error {
	if len(cmds) == 0 {
		return nil
	}
	if s.pipe != nil {
		defer s.inflight.Add(-1)
		if s.inflight.Add(1) > 1 {
			if ap, err := s.pipe(); err == nil {
				fs := make([]redis.AutoFuture, len(cmds))
				for i, c := range cmds {
					fs[i] = ap.Submit(ctx, c)
				}
				for _, f := range fs {
					if err := f.WaitContext(ctx); err != nil && ctx.Err() != nil {
						return err
					}
				}
				return nil
			}
		}
	}
	pipe := s.client.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	_, _ = pipe.Exec(ctx)
	return nil
}
