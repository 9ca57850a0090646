package protocol

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/scriptreply"
)

// The configuration in force of a bucket lives in its config key, whose
// TTL (ConfigTTL) outlives any ordinary idle spell: "<format> <id> <json>". The Lua
// side reads only the format and the id (config_check in state.lua); the
// JSON is for processes that adopt the configuration or name it in an
// error. Every state string carries the id it was written under, so a
// script whose process runs under that id never reads the config key: a
// process under another configuration finds out in the same script, before
// it writes anything.

// ConfigFormat is the config key's format, the same version as the state's.
const ConfigFormat = StateFormat

// ConfigTTL is the config key's lifetime (state.lua's CONFIG_TTL_MS),
// renewed whenever a script reads the key and whenever the scheduler goes
// idle: a bucket idle for longer forgets its limit, and the next process
// to use it stores its own.
const ConfigTTL = 30 * 24 * time.Hour

// replacedKept is how many replaced configurations a config remembers.
const replacedKept = 8

// Config is a bucket's configuration in force.
type Config struct {
	Policies []Policy
	// Replaced are the ids of the configurations that live changes
	// replaced, newest first (at most 8): a process still started with
	// one of them follows the one in force instead of failing.
	Replaced []string
	// Adapting (bucket.Config.Adapt): Policies are Base with their
	// refills slowed by Factor (in (0, 1); 0 means 1, not adapting),
	// last lowered at DownAt and last raised at UpAt (µs, Redis clock).
	// A process started with Base follows.
	Base         []Policy
	Factor       float64
	DownAt, UpAt int64
	// Peak is the factor in force when the upstream last refused.
	Peak float64
}

// ConfigID names a list of policies: "c" and 16 hex digits of a hash of
// everything that shapes a limit (unit, capacity, amount, period, order).
// It never reads as a number, so it cannot be mistaken for a state field.
func ConfigID(ps []Policy) string {
	h := fnv.New64a()
	for _, p := range ps {
		fmt.Fprintf(h, "%q %d %d %d", p.Unit, p.Capacity, p.RefillAmount, p.RefillFrequency.Microseconds())
		if p.Kind != TokenBucket { // a token bucket's id is as before kinds
			fmt.Fprintf(h, " k%d", p.Kind)
		}
		fmt.Fprint(h, ";")
	}
	return "c" + fmt.Sprintf("%016x", h.Sum64())
}

// ID is the id of c's policies.
func (c Config) ID() string { return ConfigID(c.Policies) }

type jsonPolicy struct {
	Unit     string `json:"unit"`
	Capacity int64  `json:"capacity"`
	Amount   int64  `json:"amount"`
	EveryUS  int64  `json:"every_us"`
	Kind     Kind   `json:"kind,omitempty"`
}

type jsonConfig struct {
	Policies []jsonPolicy `json:"policies"`
	Replaced []string     `json:"replaced,omitempty"`
	Base     []jsonPolicy `json:"base,omitempty"`
	Factor   float64      `json:"factor,omitempty"`
	DownAt   int64        `json:"down_at,omitempty"`
	UpAt     int64        `json:"up_at,omitempty"`
	Peak     float64      `json:"peak,omitempty"`
}

func toJSON(ps []Policy) []jsonPolicy {
	var out []jsonPolicy
	for _, p := range ps {
		out = append(out, jsonPolicy{Unit: p.Unit, Capacity: p.Capacity, Amount: p.RefillAmount, EveryUS: p.RefillFrequency.Microseconds(), Kind: p.Kind})
	}
	return out
}

func fromJSON(js []jsonPolicy) []Policy {
	var out []Policy
	for _, p := range js {
		out = append(out, Policy{Unit: p.Unit, Capacity: p.Capacity, RefillAmount: p.Amount, RefillFrequency: time.Duration(p.EveryUS) * time.Microsecond, Kind: p.Kind})
	}
	return out
}

// FormatConfig is the config key's value for c.
func FormatConfig(c Config) string {
	j := jsonConfig{Policies: toJSON(c.Policies), Replaced: c.Replaced, Base: toJSON(c.Base), Factor: c.Factor, DownAt: c.DownAt, UpAt: c.UpAt, Peak: c.Peak}
	if len(j.Replaced) > replacedKept {
		j.Replaced = j.Replaced[:replacedKept]
	}
	b, _ := json.Marshal(j) // plain strings and integers: it cannot fail
	return strconv.Itoa(ConfigFormat) + " " + c.ID() + " " + string(b)
}

// ParseConfig reads a config key's value. A later format is an error
// naming it; so is a value whose id does not match its policies.
func ParseConfig(raw string) (Config, error) {
	f, rest, ok := strings.Cut(raw, " ")
	id, js, ok2 := strings.Cut(rest, " ")
	format, err := strconv.Atoi(f)
	if !ok || !ok2 || err != nil {
		return Config{}, fmt.Errorf("%w: bucket config %q", scriptreply.ErrReply, raw)
	}
	if format > ConfigFormat {
		return Config{}, fmt.Errorf("%w: the bucket config has format %d, this process knows up to %d: upgrade it", scriptreply.ErrReply, format, ConfigFormat)
	}
	var j jsonConfig
	if err := json.Unmarshal([]byte(js), &j); err != nil || len(j.Policies) == 0 {
		return Config{}, fmt.Errorf("%w: bucket config %q", scriptreply.ErrReply, raw)
	}
	c := Config{Policies: fromJSON(j.Policies), Replaced: j.Replaced, Base: fromJSON(j.Base), Factor: j.Factor, DownAt: j.DownAt, UpAt: j.UpAt, Peak: j.Peak}
	if c.ID() != id {
		return Config{}, fmt.Errorf("%w: bucket config %q: id %s does not match its policies (%s)", scriptreply.ErrReply, raw, id, c.ID())
	}
	return c, nil
}

// Follows reports whether a process started with the configuration id
// follows c rather than failing: id is c's, its Base's, or one c replaced.
func (c Config) Follows(id string) bool {
	if id == c.ID() || (len(c.Base) > 0 && id == ConfigID(c.Base)) {
		return true
	}
	for _, r := range c.Replaced {
		if r == id {
			return true
		}
	}
	return false
}
