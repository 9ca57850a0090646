package protocol

import (
	"strconv"
	"strings"
)

// MakeEntry is entry.lua's entry: the queue entry of caller id with its
// estimated slot est (µs on the Redis clock; 0: none) and its costs (as
// Costs formats them; "" for none of its own).
func MakeEntry(id string, est int64, costs string) string {
	e := id + "|" + strconv.FormatInt(est, 10)
	if costs != "" {
		e += "|" + costs
	}
	return e
}

// Costs formats a caller's costs, one per policy, as entries and the
// enqueue script carry them: "c1,c2,...". nil gives "": the caller takes
// each policy's Call.
func Costs(cs []int64) string {
	if cs == nil {
		return ""
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = strconv.FormatInt(c, 10)
	}
	return strings.Join(parts, ",")
}

// entryParts is entry.lua's entry_parts: an entry's ID, estimate and
// costs, or ok false for a bare ID.
func entryParts(e string) (id string, est int64, costs string, ok bool) {
	// "<id>|<est>|<costs>", the ID without a '|'.
	if i := strings.IndexByte(e, '|'); i >= 0 {
		if j := strings.IndexByte(e[i+1:], '|'); j >= 0 {
			j += i + 1
			c := e[j+1:]
			if n, err := strconv.ParseInt(e[i+1:j], 10, 64); err == nil && digits(e[i+1:j]) && c != "" && strings.Trim(c, "0123456789,") == "" {
				return e[:i], n, c, true
			}
		}
	}
	// "<id>|<est>", the ID anything.
	i := strings.LastIndexByte(e, '|')
	if i < 0 || !digits(e[i+1:]) {
		return e, 0, "", false
	}
	n, err := strconv.ParseInt(e[i+1:], 10, 64)
	if err != nil {
		return e, 0, "", false
	}
	return e[:i], n, "", true
}

// digits reports whether s is one or more ASCII digits (Lua's %d+).
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// EntryID is the caller ID of an entry, or entry itself when it is a bare
// ID.
func EntryID(entry string) string {
	id, _, _, _ := entryParts(entry)
	return id
}

// EntryEstimate is the estimate of an entry, and false when it has none.
func EntryEstimate(entry string) (int64, bool) {
	_, est, _, ok := entryParts(entry)
	return est, ok
}

// EntryCosts is the costs of an entry ("" when it has none of its own).
func EntryCosts(entry string) string {
	_, _, costs, _ := entryParts(entry)
	return costs
}

// SlotValue is a slot key's value made again from its slot and its room
// (ParseSlotValue's parts): what a caller that read its slot and leaves
// hands back, so that the next caller can take the slot as it was.
func SlotValue(slot int64, room string) string {
	return strconv.FormatInt(slot, 10) + " " + room
}

// ParseSlotValue reads a slot key's value (entry.lua's slot_value): the
// slot, µs on the Redis clock, and the room after it ("" for a bare
// slot), which Retime takes back.
func ParseSlotValue(v string) (slot int64, room string, ok bool) {
	head, room, _ := strings.Cut(v, " ")
	slot, err := strconv.ParseInt(head, 10, 64)
	return slot, room, err == nil
}
