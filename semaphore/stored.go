package semaphore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// The configuration stored in Redis, KEYS[5] of sync.lua: a HASH
//
//	format    the layout of the semaphore's keys, storeFormat
//	capacity  the capacity in force
//
// sync.lua writes it (when none is stored, or in SetCapacity) and reads it
// on every call; Capacity reads it with parseStored. State written before
// the config was stored has no such key and is migrated by the first call
// that meets it.
const (
	storeFormat   = "1"                // the format this code writes and reads
	fieldFormat   = "format"           // field of the format
	fieldCapacity = "capacity"         // field of the capacity in force
	keepConfig    = 7 * 24 * time.Hour // how long the config outlives the last call
)

// errUnknownFormat is wrapped by the refusal of state in a format this
// code does not know (written by a newer version).
var errUnknownFormat = errors.New("state in a format this code does not know")

// unknownFormat is the refusal of state in format f.
func (s *Semaphore) unknownFormat(f string) error {
	return fmt.Errorf("semaphore %q: %w: Redis holds format %s, this code reads format %s only: upgrade this process",
		s.cfg.Name, errUnknownFormat, f, storeFormat)
}

// mismatch is the refusal of this process's Config.Capacity when stored
// is in force.
func (s *Semaphore) mismatch(stored int64) error {
	return fmt.Errorf("%w (stored by the first process to arrive, or by SetCapacity); deploy one Capacity, call SetCapacity, or set Config.Adopt to follow it",
		&sluice.ConfigMismatchError{
			Limiter: "semaphore",
			Name:    s.cfg.Name,
			Mine:    "capacity " + strconv.Itoa(s.cfg.Capacity),
			InForce: "capacity " + strconv.FormatInt(stored, 10),
		})
}

// parseStored reads the HMGET of the format and capacity fields: the
// capacity stored, or ok false when none is.
func (s *Semaphore) parseStored(format, capacity interface{}) (n int, ok bool, err error) {
	if format == nil && capacity == nil {
		return 0, false, nil
	}
	f, isStr := format.(string)
	if !isStr {
		return 0, false, fmt.Errorf("%w: config without a format (capacity %v)", errReply, capacity)
	}
	if f != storeFormat {
		return 0, false, s.unknownFormat(f)
	}
	c, isStr := capacity.(string)
	if !isStr {
		return 0, false, fmt.Errorf("%w: config of format %s without a capacity", errReply, f)
	}
	n, err = strconv.Atoi(c)
	if err != nil || n < 1 {
		return 0, false, fmt.Errorf("%w: stored capacity %q", errReply, c)
	}
	return n, true, nil
}
