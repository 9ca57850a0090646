package queue

import "github.com/sluicehq/sluice/internal/queueio"

// The KEYS of this package's scripts, from the bucket's keys
// (queueio.Keys; poll.lua takes them all, queueio.Keys.All).

// retimeKeys is KEYS of lua/retime.lua, lua/settle.lua and
// lua/feedback.lua: arrival's, the refunds, and (retime.lua's claims) the
// slot keys' prefix and the due set.
func retimeKeys(k queueio.Keys) []string {
	return []string{k.Queue, k.State, k.Config, k.Refunds, k.Slot, k.Due}
}

// arrivalKeys is KEYS of the scripts that need only the queue, the state
// and the config (estimate.lua).
func arrivalKeys(k queueio.Keys) []string { return []string{k.Queue, k.State, k.Config} }

// enqueueKeys is KEYS of lua/enqueue.lua: arrival's, then the slot keys'
// prefix, the refunds and the due set, for its help (a late scheduler's
// step).
func enqueueKeys(k queueio.Keys) []string {
	return append([]string{k.Queue, k.State, k.Config, k.Slot, k.Refunds, k.Due}, k.Lanes()...)
}

// estimateKeys is KEYS of lua/estimate.lua: arrival's, then the lanes'.
func estimateKeys(k queueio.Keys) []string {
	return append(arrivalKeys(k), k.Lanes()...)
}

// fastKeys is KEYS of lua/fast.lua: arrival's, then the set of classes
// (a caller waits in a named lane: not fast.lua's case).
func fastKeys(k queueio.Keys) []string {
	return append(arrivalKeys(k), k.Classes)
}
