package groundwork

import (
	"errors"
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

// ConfigError returns pkg's ErrConfig: its message is "<pkg>: invalid
// config" and it matches sluice.ErrConfig.
func ConfigError(pkg string) error {
	return &sentinel{msg: pkg + ": invalid config", parent: sluice.ErrConfig}
}

// Invalid returns an error wrapping errConfig (a package's ErrConfig) that
// says what is wrong.
func Invalid(errConfig error, format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errConfig}, a...)...)
}

// CheckPrefix checks a KeyPrefix: a brace would end or open the hash tag.
func CheckPrefix(errConfig error, prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return Invalid(errConfig, "KeyPrefix %q contains a brace ('{' or '}'), which would break the hash tag", prefix)
	}
	return nil
}

// ErrReply reports a Redis reply of an unexpected shape.
var ErrReply = errors.New("unexpected reply from Redis")
