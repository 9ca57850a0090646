// Package configerr is the convention every limiter of this module follows
// for its sentinel errors (Kind: "<pkg>: queue full") and for a
// configuration it refuses: each package's unexported errConfig
// ("<pkg>: invalid config") matches sluice.ErrConfig, and each refusal
// wraps it with words that say what is wrong.
package configerr

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice"
)

// sentinel is an error with its own message that also matches a parent.
type sentinel struct {
	msg    string
	parent error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.parent }

// New returns pkg's config error: its message is "<pkg>: invalid config"
// and it matches sluice.ErrConfig.
func New(pkg string) error {
	return &sentinel{msg: pkg + ": invalid config", parent: sluice.ErrConfig}
}

// Kind returns pkg's own sentinel for parent, one of package sluice's:
// its message is parent's with pkg for "sluice" ("bucket: queue full"
// for sluice.ErrQueueFull, not "bucket: sluice: queue full: sluice:
// limited") and it matches parent.
func Kind(pkg string, parent error) error {
	return Sentinel(pkg+": "+strings.TrimPrefix(parent.Error(), "sluice: "), parent)
}

// Sentinel returns an error whose message is msg and that matches parent.
func Sentinel(msg string, parent error) error { return &sentinel{msg: msg, parent: parent} }

// Invalid returns an error wrapping errConfig (a package's New) that
// says what is wrong.
func Invalid(errConfig error, format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errConfig}, a...)...)
}
