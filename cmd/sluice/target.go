package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	sl "github.com/sluicehq/sluice"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
)

// opTimeout bounds each call to Redis: an operator's command should say
// that Redis does not answer rather than hang.
const opTimeout = 10 * time.Second

// target is the Redis and the key prefix every command's flags name.
type target struct {
	redisURL string
	prefix   string
	addr     string // host:port from redisURL, for messages (the URL may hold a password)
}

// flags returns the flag set of command name with --redis and --prefix;
// synopsis and about head its --help.
func (t *target) flags(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors and help itself
	fs.StringVar(&t.redisURL, "redis", "redis://localhost:6379", "the Redis server, as a `URL` (redis:// or rediss:// for TLS; redis://user:pass@host:port/db)")
	fs.StringVar(&t.prefix, "prefix", "sluice", "the buckets' KeyPrefix (bucket.Config.KeyPrefix)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice %s %s\n\n%s\n\nFlags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args, whose flags may come before or after the positional
// arguments ("--" ends the flags). ok is false after --help, which it
// writes to stdout; a bad flag is a *usageError.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (pos []string, ok bool, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fs.Usage()
				return nil, false, nil
			}
			return nil, false, usagef("%s: %v (see '%s --help')", strings.TrimPrefix(fs.Name(), "sluice "), err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, true, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), true, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// client is a client of the Redis --redis names, with ContextTimeoutEnabled
// as package bucket requires.
func (t *target) client() (*redis.Client, error) {
	opt, err := redis.ParseURL(t.redisURL)
	if err != nil {
		return nil, usagef("--redis %q: %v (want redis://host:port or rediss://host:port)", t.redisURL, err)
	}
	opt.ContextTimeoutEnabled = true
	t.addr = opt.Addr
	return redis.NewClient(opt), nil
}

// placeholder is the policy of a handle that only reads: it never reaches
// Redis (Inspect reports the stored policies, or none), but bucket.New
// wants one.
var placeholder = []bucket.Policy{bucket.Rate(1, time.Second, 1)}

// open returns a client and a handle on bucket name that follows the
// policies in force (Config.Adopt). own are the handle's own policies,
// which a script of it would store were none stored: the command passes
// the policies in force, or the ones it sets, or placeholder when it only
// reads. The caller closes both.
func (t *target) open(name string, own []bucket.Policy) (*redis.Client, *bucket.Bucket, error) {
	rdb, err := t.client()
	if err != nil {
		return nil, nil, err
	}
	b, err := bucket.New(rdb, bucket.Config{Name: name, KeyPrefix: t.prefix, Policies: own, Adopt: true})
	if err != nil {
		rdb.Close()
		if errors.Is(err, sl.ErrConfig) {
			return nil, nil, usagef("bucket %q with --prefix %q: %v", name, t.prefix, err)
		}
		return nil, nil, err
	}
	return rdb, b, nil
}

// inspect is b.Inspect under opTimeout, its error naming the bucket and
// the server.
func (t *target) inspect(ctx context.Context, b *bucket.Bucket, name string) (bucket.Inspection, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	in, err := b.Inspect(ctx)
	if err != nil {
		return in, t.failed("reading", name, err)
	}
	return in, nil
}

// failed wraps err of doing what to bucket name on the target.
func (t *target) failed(what, name string, err error) error {
	return fmt.Errorf("%s bucket %q on %s: %w", what, name, t.addr, err)
}

// oneName checks that pos is one bucket name.
func oneName(fs *flag.FlagSet, pos []string) (string, error) {
	switch {
	case len(pos) == 0:
		return "", usagef("%s: no bucket NAME given (see '%s --help')", strings.TrimPrefix(fs.Name(), "sluice "), fs.Name())
	case len(pos) > 1:
		return "", usagef("%s: one bucket NAME, got %d arguments: %q", strings.TrimPrefix(fs.Name(), "sluice "), len(pos), pos)
	case pos[0] == "":
		return "", usagef("%s: empty bucket NAME", strings.TrimPrefix(fs.Name(), "sluice "))
	}
	return pos[0], nil
}

// noConfig is what every command says of a bucket with no policies stored.
const noConfig = "no configuration stored: the bucket was never used, or idle for 30 days"
