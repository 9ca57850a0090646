package sluice

// Lane describes a lane whose callers are served differently from the
// default (bucket.Config.Lanes, semaphore.Config.Lanes). A call says its
// lane with bucket.WithLane (semaphore.WithLane is the same); a lane not
// listed has weight 1 and priority 0, like the callers that name none
// (the default lane), so that thousands of tenants need no
// configuration. docs/lanes.md says how to choose weights and
// priorities, with the formulas.
type Lane struct {
	// Name is what WithLane names: 1 to 128 bytes of printable text,
	// without spaces or '|'.
	Name string
	// Weight is the lane's share among the lanes of its priority that
	// have callers waiting: each gets at least Weight / (the sum of their
	// weights) of what their priority is served, counted in the unit of a
	// bucket's first policy (a call of cost 60 counts 60; a semaphore
	// counts permits). 0 means 1; at most 1,000,000.
	Weight int
	// Priority: a lane of a higher priority is served first, but each
	// priority below one with callers waiting keeps a floor of 1/16 of
	// what is served while it waits, so that no lane waits forever. 0
	// (the default lane's) is the lowest; at most 1000.
	Priority int
}
