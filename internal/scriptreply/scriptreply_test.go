package scriptreply_test

import (
	"context"
	"errors"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/scriptreply"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestRaised: a string a script raises with error(msg, 0), deep in a
// function or at the top, comes back as msg from redis-server and from
// miniredis alike, by EVAL and by EVALSHA; a reply that is not such a
// raise of level 0 (a command's own error, error_reply, a raise at level
// 1, a success) is not read as one.
func TestRaised(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	servers := map[string]*redis.Client{
		"redis-server": redistest.New(t).Client(),
		"miniredis":    redis.NewClient(&redis.Options{Addr: mr.Addr()}),
	}
	for name, rdb := range servers {
		t.Cleanup(func() { rdb.Close() })
		for _, tc := range []struct {
			script, want string
		}{
			{"local function check() error('SLUICE_CONFIG unset', 0) end\ncheck()\nreturn 1", "SLUICE_CONFIG unset"},
			{"error('SLUICE_CONFIG c0123456789abcdef', 0)", "SLUICE_CONFIG c0123456789abcdef"},
			{"error('sluice: the bucket state has format 3, this process knows up to 2: upgrade it', 0)",
				"sluice: the bucket state has format 3, this process knows up to 2: upgrade it"},
			{"error('a script: that names, on @user_script:1. itself', 0)", "a script: that names, on @user_script:1. itself"},
		} {
			s := redis.NewScript(tc.script)
			err := s.Run(ctx, rdb, nil).Err() // EVALSHA, then EVAL
			if got, ok := scriptreply.Raised(err); !ok || got != tc.want {
				t.Errorf("%s: Raised(%v) = %q, %v; want %q", name, err, got, ok, tc.want)
			}
			err = s.Run(ctx, rdb, nil).Err() // EVALSHA of the script loaded
			if got, ok := scriptreply.Raised(err); !ok || got != tc.want {
				t.Errorf("%s, loaded: Raised(%v) = %q, %v; want %q", name, err, got, ok, tc.want)
			}
		}
		for _, script := range []string{
			"return redis.error_reply('SLUICE_CONFIG unset')",
			"error('SLUICE_CONFIG unset')",                                       // level 1: positioned
			"redis.call('SET', KEYS[1], 'x') return redis.call('LLEN', KEYS[1])", // WRONGTYPE
			"return 1",
		} {
			err := rdb.Eval(ctx, script, []string{t.Name()}).Err()
			if got, ok := scriptreply.Raised(err); ok {
				t.Errorf("%s: %q: Raised(%v) = %q, true; want false", name, script, err, got)
			}
		}
	}
}

// TestRaisedRedis6: Redis 6.2 (not started here) wraps a raise as
// scripting.c's evalGenericCommand and its error handler do.
func TestRaisedRedis6(t *testing.T) {
	err := redisError("ERR Error running script (call to f_8a8e3b2bb4c1e2f7e0b6f0a8a36b2d5d52c6e0f1): @user_script:66: SLUICE_CONFIG unset ")
	if got, ok := scriptreply.Raised(err); !ok || got != "SLUICE_CONFIG unset" {
		t.Errorf("Raised = %q, %v", got, ok)
	}
	if _, ok := scriptreply.Raised(errors.New("ERR SLUICE_CONFIG unset")); ok {
		t.Error("Raised read an error that is not Redis's")
	}
}

// redisError is an error reply, as go-redis returns one.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}
