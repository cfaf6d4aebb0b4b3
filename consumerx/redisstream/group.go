package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// groupScript creates the consumer group if it is missing and returns
// its last delivered id, in one step (no other client's command comes
// between). ARGV[3] "start" (Run starting) creates it at ARGV[2]
// (Options.Start) and leaves a group that exists as it is. "again" (a
// command found the group gone) creates it at ARGV[2], the highest id the
// consumer knows the lost group delivered; a group another consumer
// created again meanwhile is moved forward to ARGV[2] if it is behind
// (never back), so that whichever consumer is first, the group starts
// after the highest id any of them had read. A stream whose last id is
// behind ARGV[2] (the stream was deleted: made again here with MKSTREAM,
// by a producer's XADD, or by a consumer that had read less, which set it
// to its own id) gets ARGV[2] as its last id (XSETID), so later
// XADD ids are above it: "*" ids follow on even with a clock set back,
// and an explicit id at or below it is refused instead of never being
// delivered. The second value returned is the stream's last id when a
// producer had made it again behind ARGV[2], or had added to it above the
// id the group is moved forward from: its entries so far (those above
// that id) are not delivered to the group.
var groupScript = redis.NewScript(`
local function lastDelivered()
  if redis.call('EXISTS', KEYS[1]) == 0 then return false end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == ARGV[1] then return f['last-delivered-id'] end
  end
  return false
end
-- a < b for stream ids "<ms>-<seq>" (decimal, no leading zeros)
local function less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
-- raise gives the stream ARGV[2] as its last id if its last id is behind
-- it, and returns the last id it had then, else ''.
local function raise()
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' and less(info[i + 1], ARGV[2]) then
      redis.call('XSETID', KEYS[1], ARGV[2])
      return info[i + 1]
    end
  end
  return ''
end
local last = lastDelivered()
if ARGV[3] == 'start' then
  if not last then
    redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
    last = lastDelivered()
  end
  return {last, ''}
end
if last then
  local behind = ''
  if less(last, ARGV[2]) then
    redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[2])
    local was = raise()
    if was ~= '' and less(last, was) then behind = was end
    last = ARGV[2]
  end
  return {last, behind}
end
local made = redis.call('EXISTS', KEYS[1]) == 0
redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
local behind = raise()
if made then behind = '' end
return {ARGV[2], behind}
`)

// createGroup creates the group from Options.Start if it does not exist,
// as Run starts, and remembers the id it starts after (see read).
func (c *Consumer) createGroup(ctx context.Context) error {
	last, _, err := c.group(ctx, c.opts.Start, "start")
	if err != nil {
		return err
	}
	c.read = maxID(c.read, last)
	return nil
}

// noGroup creates the group again if err says it is gone (NOGROUP: the
// group was destroyed, or the stream deleted; or, to an XREADGROUP
// blocked as the stream was deleted, streamDeleted), and returns err with the
// creation's error, if any. The group starts after c.read, the highest
// entry id the lost group is known to have delivered, not from
// Options.Start: entries it delivered are not delivered again, for their
// records may have expired (their effects would run again). See
// Options.Group.
func (c *Consumer) noGroup(ctx context.Context, err error) error {
	if msg := err.Error(); !strings.HasPrefix(msg, "NOGROUP") && msg != streamDeleted {
		return err
	}
	last, behind, gerr := c.group(ctx, c.read, "again")
	if gerr != nil {
		return errors.Join(err, gerr)
	}
	c.read = maxID(c.read, last)
	if behind != "" {
		c.log.ErrorContext(ctx, "redisstream: consumer group created again on a stream whose last id was behind the last id read (the stream made again): its entries at or below the group's id are not delivered; add again any that were not run",
			"group_id", last, "stream_last_id", behind)
	} else {
		c.log.WarnContext(ctx, "redisstream: consumer group was gone: created again after the last entry read", "group_id", last)
	}
	return err
}

// streamDeleted is Redis's answer to an XREADGROUP blocked as its stream
// is deleted. Every consumer blocked then is told at once, and creates
// the group again at once, as on NOGROUP: were they to wait for their next
// command's NOGROUP, the first to send one would make the group at its own
// id and the others would find it there, never moving it forward to
// theirs.
const streamDeleted = "UNBLOCKED the stream key no longer exists"

// group runs groupScript with id and mode.
func (c *Consumer) group(ctx context.Context, id, mode string) (last, behind string, err error) {
	v, err := groupScript.Run(ctx, c.client, []string{c.opts.Stream}, c.opts.Group, id, mode).StringSlice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("reply %v", v)
	}
	if err != nil {
		return "", "", fmt.Errorf("redisstream: create group %s on %s: %w", c.opts.Group, c.opts.Stream, err)
	}
	return v[0], v[1], nil
}

// maxID returns the greater of two stream entry ids; an id that is not
// one ("" at first) is less than any.
func maxID(a, b string) string {
	am, as, aok := splitID(a)
	bm, bs, bok := splitID(b)
	switch {
	case !aok:
		return b
	case !bok:
		return a
	case am > bm || am == bm && as > bs:
		return a
	}
	return b
}

func splitID(id string) (ms, seq uint64, ok bool) {
	m, s, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(m, 10, 64)
	seq, err2 := strconv.ParseUint(s, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}
