package bucket

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
)

// Policy is one limit of a bucket in one unit: it holds at most Capacity
// tokens and gains RefillAmount every RefillFrequency (a token bucket, the
// default Kind), or it is a window of length RefillFrequency that grants
// at most Capacity (Kind FixedWindow or RollingWindow; make one with Fixed
// or Rolling).
type Policy struct {
	// Unit names what the policy counts. "" counts calls: Enter takes 1
	// token of it and EnterN n. A policy of any other unit ("pu",
	// "tokens", "bytes") is taken from only by EnterCost.
	Unit            string
	Capacity        int
	RefillAmount    int
	RefillFrequency time.Duration
	// Kind is TokenBucket (the zero value), FixedWindow or RollingWindow.
	// A window's RefillFrequency is its length and its RefillAmount its
	// Capacity (0 means Capacity).
	Kind Kind
}

// Kind is the kind of limit a Policy is. See docs/limits.md, "Windows".
type Kind int

const (
	// TokenBucket holds at most Capacity tokens and gains RefillAmount
	// every RefillFrequency: in any window of length T it grants at most
	// Capacity + RefillAmount × (⌊T / RefillFrequency⌋ + 1). The default.
	TokenBucket Kind = iota
	// FixedWindow grants at most Capacity in each window of length
	// RefillFrequency, the windows starting at whole multiples of it on
	// the Redis clock plus a lag of min(half a window, 5 ms) (an API whose
	// quota resets every whole minute, hour or day); a Sync whose reset
	// the upstream announces moves them later, to the upstream's. Tokens
	// promised to slots past a window's end count in the next one.
	FixedWindow
	// RollingWindow grants at most Capacity in any window of length
	// RefillFrequency, including both its ends: each grant's tokens come
	// back that long after it, plus a lag of min(half a window, 5 ms) for
	// the jitter between a slot and the upstream's arrival of its request
	// (at most 0.5 % of a window of a second). Its grants are logged in a
	// Redis list of the bucket; the window must be longer than
	// Config.Lookahead.
	RollingWindow
)

func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "TokenBucket"
	case FixedWindow:
		return "FixedWindow"
	case RollingWindow:
		return "RollingWindow"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fixed is a FixedWindow policy counting calls that grants at most n in
// each window of length window: Fixed(5000, time.Hour) is "5,000 an hour,
// resetting on the hour". Set Unit on the result for another unit.
func Fixed(n int, window time.Duration) Policy {
	return Policy{Capacity: n, RefillAmount: n, RefillFrequency: window, Kind: FixedWindow}
}

// Rolling is a RollingWindow policy counting calls that grants at most n
// in any window of length window: Rolling(20, time.Second) never lets 21
// calls start within one second. Set Unit on the result for another
// unit.
func Rolling(n int, window time.Duration) Policy {
	return Policy{Capacity: n, RefillAmount: n, RefillFrequency: window, Kind: RollingWindow}
}

// Rate is a policy counting calls that allows n per period with bursts of
// up to burst at once: Rate(20, time.Second, 5) is "20 per second, burst
// 5", a Capacity of 5 and 1 token every 50 ms. Refills are discrete: the
// bucket gains RefillAmount tokens at once every RefillFrequency, and Rate
// picks the smallest amount that keeps the rate exact in whole
// microseconds (1000 a minute: 1 every 60 ms). When that amount would
// exceed burst, it adds 1 token every ⌈period / n⌉ instead, a rate never
// above n per period. For another unit, say it with In:
// Rate(90_000, time.Minute, 15_000).In("tokens"). Invalid arguments give
// a policy New refuses with a message naming them.
func Rate(n int, period time.Duration, burst int) Policy {
	us := period.Microseconds()
	if n < 1 || burst < 1 || us < 1 || period%time.Microsecond != 0 {
		return Policy{Capacity: burst, RefillAmount: n, RefillFrequency: period}
	}
	g := gcd(int64(n), us)
	amount, every := int64(n)/g, us/g
	if amount > int64(burst) {
		amount, every = 1, (us+int64(n)-1)/int64(n)
	}
	return Policy{Capacity: burst, RefillAmount: int(amount), RefillFrequency: time.Duration(every) * time.Microsecond}
}

// In returns p counting unit instead: Rate(…).In("tokens"),
// Fixed(…).In("pu"). "" counts calls.
func (p Policy) In(unit string) Policy {
	p.Unit = unit
	return p
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Cost is what one caller takes, by unit: Cost{"": 1, "pu": 60} is one
// call and 60 processing units. A unit missing from it costs 0, and leaves
// its policies untouched.
type Cost map[string]int

// costs turns c into a cost per policy: nil when it is what Enter takes
// (each policy counting calls 1, the others 0), and zero when c takes
// nothing from any policy. A unit no policy counts and a negative cost are
// errors matching sluice.ErrConfig (a bug to fix, as a bad Config is); a
// cost above a policy's Capacity is one matching
// sluice.ErrCostExceedsCapacity.
func (b *Bucket) costs(c Cost) (costs []int64, zero bool, err error) {
	policies := b.inForce()
	for unit, n := range c {
		if n < 0 {
			return nil, false, fmt.Errorf("bucket: negative cost %d of unit %q (%w)", n, unit, sluice.ErrConfig)
		}
		if n > 0 && !slices.ContainsFunc(policies, func(p Policy) bool { return p.Unit == unit }) {
			return nil, false, fmt.Errorf("bucket: cost of unit %q, which no policy of bucket %q counts (%w)", unit, b.cfg.Name, sluice.ErrConfig)
		}
	}
	costs = make([]int64, len(policies))
	plain, zero := true, true
	for i, p := range policies {
		n := c[p.Unit]
		if n > p.Capacity {
			return nil, false, fmt.Errorf("%w: %d %s above the Capacity %d of policy %d (%s), so it could never be granted",
				errCostExceedsCapacity, n, unitName(p.Unit), p.Capacity, i, describe(p))
		}
		call := 0 // what Enter takes
		if p.Unit == "" {
			call = 1
		}
		costs[i] = int64(n)
		plain = plain && n == call
		zero = zero && n == 0
	}
	if plain {
		return nil, false, nil
	}
	return costs, zero, nil
}
