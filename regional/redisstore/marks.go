package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/regional"
)

var _ regional.MarkStore = (*Store)(nil)

// Fields of a marks hash that are not keys: a key's field is its name
// (KeyString: the limit's name first), which never starts with a NUL.
const (
	lowField   = "\x00low"
	floorField = "\x00floor"
)

// maxFieldsPerHSet bounds the fields of one HSET, so that a snapshot of
// many keys does not block Redis with one command.
const maxFieldsPerHSet = 512

// marksKey is the hash of one instance's marks of a limit in a window:
// "<prefix>{marks/instance/domain/limit@period:window}".
func (s *Store) marksKey(instance string, m *regional.Marks) string {
	return s.key(fmt.Sprintf("marks/%s/%s/%s@%d:%d", instance, m.Domain, m.Limit, m.Period.Milliseconds(), m.Window))
}

// SaveMarks implements regional.MarkStore: one hash per instance, limit
// and window, its fields a key's mark each and the record's low and
// floor, written with HSET (at most 512 fields a command) and made to
// expire at the window's end (PEXPIREAT, on this process's clock), all
// in one pipeline. It does not go through the breaker: it runs off the
// request path, once a persistence interval.
func (s *Store) SaveMarks(ctx context.Context, now time.Time, instance string, marks []regional.Marks) error {
	if len(marks) == 0 {
		return nil
	}
	start := time.Now()
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range marks {
			m := &marks[i]
			end := time.Unix(0, (m.Window+1)*int64(m.Period))
			if m.Period <= 0 || !end.After(now) {
				continue
			}
			key := s.marksKey(instance, m)
			args := []any{lowField, num(m.Low), floorField, num(m.Floor)}
			for _, k := range m.Keys {
				if len(args) >= 2*maxFieldsPerHSet {
					p.HSet(ctx, key, args...)
					args = args[:0]
				}
				args = append(args, k.Key, num(k.Mark))
			}
			p.HSet(ctx, key, args...)
			p.PExpireAt(ctx, key, end)
		}
		return nil
	})
	s.metrics.observe("marks", err, time.Since(start), len(marks))
	if err != nil {
		return fmt.Errorf("redisstore: save marks: %w", err)
	}
	return nil
}

// LoadMarks implements regional.MarkStore: one HGETALL per record
// wanted, pipelined.
func (s *Store) LoadMarks(ctx context.Context, instance string, want []regional.Marks) ([]regional.Marks, error) {
	if len(want) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.MapStringStringCmd, len(want))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range want {
			cmds[i] = p.HGetAll(ctx, s.marksKey(instance, &want[i]))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: load marks: %w", err)
	}
	var out []regional.Marks
	for i, c := range cmds {
		fields := c.Val()
		if len(fields) == 0 {
			continue
		}
		m := regional.Marks{Domain: want[i].Domain, Limit: want[i].Limit, Period: want[i].Period, Window: want[i].Window}
		for f, v := range fields {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: marks field %q = %q", ErrBadReply, f, v)
			}
			switch f {
			case lowField:
				m.Low = x
			case floorField:
				m.Floor = x
			default:
				m.Keys = append(m.Keys, regional.KeyMark{Key: f, Mark: x})
			}
		}
		if _, ok := fields[lowField]; !ok {
			// Fields of keys without a record's own: not written by
			// SaveMarks, which writes them first. Take nothing from it.
			return nil, fmt.Errorf("%w: marks hash without a low", ErrBadReply)
		}
		slices.SortFunc(m.Keys, func(a, b regional.KeyMark) int { return cmp.Compare(a.Key, b.Key) })
		out = append(out, m)
	}
	return out, nil
}

func num(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
