package protocol

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/scriptreply"
)

// StateFormat is the version of the state's layout this code writes
// (state.lua's FORMAT).
const StateFormat = 2

// BucketState is the state key of a bucket (load and save in state.lua):
// "done until level1 anchor1 ... format id hold held [costed extra1 ... [peaks]]",
// integers separated by spaces but for id. Done counts the tickets no longer
// queued; Until is the Redis instant (µs) to which the scheduler's lock
// was last renewed, 0 once released; then each policy's level (may be
// negative: tokens promised to slots in the future) and anchor (µs, its
// last refill counted).
type BucketState struct {
	Done, Until int64
	Levels      []Level
	// Format is the layout's version, StateFormat when written by this
	// code, 1 for the layout without ID, 0 for the one without a version.
	Format int64
	// ID names the configuration the levels were written under
	// (ConfigID); "" before format 2.
	ID string
	// Hold is until when (µs, Redis clock; 0: none) no slot comes that
	// takes from a held policy: Held is their bitmask (bit 0 the first),
	// 0 meaning every policy. Format 2 only.
	Hold, Held int64
	// Costed counts the queued callers with costs of their own; Extra is,
	// per policy, the tokens they need beyond the policy's Call each (nil
	// when Costed is 0).
	Costed int64
	Extra  []int64
	// Peaks is the token state.lua's peaks are kept in ("p<floor>/<t>:<v1>,...";
	// "" for none): what the scripts need to give a late caller's tokens
	// back exactly, which only they read. With peaks, Costed and Extra are
	// written even when 0.
	Peaks string
}

// Holds reports whether the state's hold keeps policy i's slots at now.
func (s BucketState) Holds(i int, now int64) bool {
	return s.Hold > now && (s.Held == 0 || s.Held&(1<<i) != 0)
}

// Level is one policy's part of the state.
type Level struct {
	Level, Anchor int64
}

// String is the state as state.lua writes it in s.Format (2, 1 or 0).
func (s BucketState) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(s.Done, 10))
	b.WriteByte(' ')
	b.WriteString(strconv.FormatInt(s.Until, 10))
	for _, l := range s.Levels {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(l.Level, 10))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(l.Anchor, 10))
	}
	if s.Format > 0 || s.Costed > 0 {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(s.Format, 10))
	}
	if s.Format >= 2 {
		b.WriteByte(' ')
		b.WriteString(s.ID)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(s.Hold, 10))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(s.Held, 10))
	}
	if s.Costed > 0 || s.Peaks != "" {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(s.Costed, 10))
		for i := range s.Levels {
			var x int64
			if i < len(s.Extra) {
				x = s.Extra[i]
			}
			b.WriteByte(' ')
			b.WriteString(strconv.FormatInt(x, 10))
		}
	}
	if s.Peaks != "" {
		b.WriteByte(' ')
		b.WriteString(s.Peaks)
	}
	return b.String()
}

// ParseState reads a state string as state.lua's load does, for n
// policies: then the format, the id and the hold (format 2) and, if
// present, the costed callers and n extras. A format above StateFormat is an error
// naming it.
func ParseState(raw string, n int) (BucketState, error) {
	f := strings.Fields(raw)
	if len(f) < 2+2*n {
		return BucketState{}, fmt.Errorf("%w: state %q for %d policies", scriptreply.ErrReply, raw, n)
	}
	num := func(i int) (int64, error) {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: state %q", scriptreply.ErrReply, raw)
		}
		return x, nil
	}
	v := make([]int64, 2+2*n)
	for i := range v {
		x, err := num(i)
		if err != nil {
			return BucketState{}, err
		}
		v[i] = x
	}
	s := BucketState{Done: v[0], Until: v[1], Levels: make([]Level, n)}
	for i := range s.Levels {
		s.Levels[i] = Level{Level: v[2+2*i], Anchor: v[3+2*i]}
	}
	if len(f) == 2+2*n {
		return s, nil
	}
	at, err := s.parseVersion(f, 2+2*n, num, raw)
	if err != nil {
		return BucketState{}, err
	}
	if len(f) >= at+1+n {
		x := make([]int64, 1+n)
		for i := range x {
			if x[i], err = num(at + i); err != nil {
				return BucketState{}, err
			}
		}
		s.Costed, s.Extra = x[0], x[1:]
		if s.Costed == 0 {
			s.Extra = nil
		}
		if p := at + 1 + n; len(f) > p && strings.HasPrefix(f[p], "p") {
			s.Peaks = f[p]
		}
	}
	return s, nil
}

// parseVersion reads the format at f[at] and, for this format, the id and
// the hold after it, into s; it returns where the callers with costs start.
func (s *BucketState) parseVersion(f []string, at int, num func(int) (int64, error), raw string) (int, error) {
	var err error
	if s.Format, err = num(at); err != nil {
		return 0, err
	}
	at++
	switch {
	case s.Format > StateFormat:
		return 0, fmt.Errorf("%w: the bucket state has format %d, this process knows up to %d: upgrade it", scriptreply.ErrReply, s.Format, StateFormat)
	case s.Format == StateFormat:
		if len(f) < at+3 {
			return 0, fmt.Errorf("%w: state %q has no configuration id or hold", scriptreply.ErrReply, raw)
		}
		s.ID = f[at]
		if s.Hold, err = num(at + 1); err != nil {
			return 0, err
		}
		if s.Held, err = num(at + 2); err != nil {
			return 0, err
		}
		at += 3
	}
	return at, nil
}
