package protocol

import (
	"strconv"
	"strings"
)

// MakeEntry is entry.lua's entry: the queue entry of caller id with its
// estimated slot est (µs on the Redis clock; 0: none).
func MakeEntry(id string, est int64) string {
	return id + "|" + strconv.FormatInt(est, 10)
}

// EntryID is the caller ID of an entry, or entry itself when it is a bare
// ID (entry.lua's entry_parts).
func EntryID(entry string) string {
	id, _, _ := strings.Cut(entry, "|")
	return id
}

// EntryEstimate is the estimate of an entry, and false when it has none.
func EntryEstimate(entry string) (int64, bool) {
	i := strings.LastIndexByte(entry, '|')
	if i < 0 {
		return 0, false
	}
	est, err := strconv.ParseInt(entry[i+1:], 10, 64)
	return est, err == nil && est >= 0
}
