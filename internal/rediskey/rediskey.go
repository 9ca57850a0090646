// Package rediskey names a limiter's Redis keys: "<prefix>:{<escaped
// name>}:", one hash tag per limiter, any byte string a valid name.
package rediskey

import (
	"strings"

	"github.com/sluicehq/sluice/internal/configerr"
)

// DefaultPrefix starts every key when a Config leaves KeyPrefix empty.
const DefaultPrefix = "sluice"

// Base is the common start of every key and channel of the limiter name
// under prefix: "<prefix>:{<escaped name>}:". All keys of one limiter share
// the hash tag, so on Redis Cluster they live in one slot and a script may
// touch them all, and an ACL pattern such as ~sluice:* covers them.
func Base(prefix, name string) string {
	return prefix + ":{" + EscapeName(name) + "}:"
}

var nameEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeName percent-encodes '%', '{' and '}' in name, so that any byte
// string is a valid name, no name can end the hash tag early, and two
// different names never escape to the same string.
func EscapeName(name string) string {
	if !strings.ContainsAny(name, "%{}") {
		return name
	}
	return nameEscaper.Replace(name)
}

var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// GlobEscape escapes the glob characters of s for a SCAN MATCH pattern.
func GlobEscape(s string) string { return globEscaper.Replace(s) }

// CheckPrefix checks a KeyPrefix: a brace would end or open the hash tag.
func CheckPrefix(errConfig error, prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return configerr.Invalid(errConfig, "KeyPrefix %q contains a brace ('{' or '}'), which would break the hash tag", prefix)
	}
	return nil
}
