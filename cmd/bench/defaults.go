package main

import "time"

// The bucket's defaults, as its Config documents them.
const (
	defaultMaxLateness = 25 * time.Millisecond
	defaultKeyPrefix   = "sluice"
)
