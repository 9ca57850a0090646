package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	sl "github.com/sluicehq/sluice"
)

// sluice serve's HTTP side: routing, the bearer token, and how requests
// are read and answered (bodies, errors and their reasons).

// handler routes the API (docs/sidecar.md).
func (s *sidecar) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /metrics", s.auth(s.metrics))
	mux.HandleFunc("POST /v1/buckets/{name}/enter", s.auth(s.enter))
	mux.HandleFunc("POST /v1/buckets/{name}/reserve", s.auth(s.reserve))
	mux.HandleFunc("POST /v1/buckets/{name}/settle", s.auth(s.settle))
	mux.HandleFunc("POST /v1/buckets/{name}/cancel", s.auth(s.cancel))
	mux.HandleFunc("POST /v1/buckets/{name}/estimate", s.auth(s.estimate))
	mux.HandleFunc("GET /v1/buckets/{name}", s.auth(s.inspectBucket))
	mux.HandleFunc("POST /v1/semaphores/{name}/acquire", s.auth(s.acquire))
	mux.HandleFunc("POST /v1/semaphores/{name}/renew", s.auth(s.renew))
	mux.HandleFunc("POST /v1/semaphores/{name}/release", s.auth(s.release))
	mux.HandleFunc("GET /v1/semaphores/{name}", s.auth(s.inspectSemaphore))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "no endpoint %s %s (docs/sidecar.md lists them)", r.Method, r.URL.Path)
	})
	return mux
}

// auth checks the bearer token, when the server has one.
func (s *sidecar) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.opt.token == "" {
		return h
	}
	want := []byte("Bearer " + s.opt.token)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			fail(w, http.StatusUnauthorized, "missing or wrong bearer token (Authorization: Bearer <the --token-file's token>)")
			return
		}
		h(w, r)
	}
}

func (s *sidecar) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		fail(w, http.StatusServiceUnavailable, "Redis at %s does not answer a PING within 1s: %v", s.opt.addr, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"status": "ok"})
}

// apiError is every error reply's body: the error in words, and its
// reason as a word a client can switch on.
type apiError struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
	// RetryAfterMS is, for wait_too_long, how long until the caller's
	// earliest turn.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Reasons of apiError.
const (
	reasonWaitTooLong = "wait_too_long" // 429: not granted within timeout_ms
	reasonQueueFull   = "queue_full"    // 429: MaxQueue or --max-waiting callers already wait
)

// reasons are the other errors' reasons, by status.
var reasons = map[int]string{
	http.StatusBadRequest:            "bad_request",
	http.StatusUnauthorized:          "unauthorized",
	http.StatusNotFound:              "not_found",
	http.StatusConflict:              "config_mismatch",
	http.StatusGone:                  "lease_lost",
	http.StatusRequestEntityTooLarge: "too_large",
	http.StatusInternalServerError:   "internal",
	http.StatusServiceUnavailable:    "unavailable",
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, a ...any) {
	reply(w, code, apiError{Error: fmt.Sprintf(format, a...), Reason: reasons[code]})
}

// refuse answers 429 for reason, with when the caller may try again, if
// known.
func refuse(w http.ResponseWriter, reason string, retryAfter time.Duration, format string, a ...any) {
	e := apiError{Error: fmt.Sprintf(format, a...), Reason: reason}
	if retryAfter > 0 {
		e.RetryAfterMS = int64(math.Ceil(float64(retryAfter) / float64(time.Millisecond)))
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retryAfter.Seconds())), 10))
	}
	reply(w, http.StatusTooManyRequests, e)
}

// decode reads the request's JSON body into v; an empty body leaves v as
// it is. It answers and returns false when the body is too large or not
// the JSON expected.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			fail(w, http.StatusRequestEntityTooLarge, "request body above %d bytes", maxBody)
		} else {
			fail(w, http.StatusBadRequest, "reading the request body: %v", err)
		}
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, "request body is not the JSON expected: %v", err)
		return false
	}
	if dec.More() {
		fail(w, http.StatusBadRequest, "request body has more than one JSON value")
		return false
	}
	return true
}

// timeout reads timeout_ms: 0 waits as long as needed.
func timeout(w http.ResponseWriter, ms int64) (time.Duration, bool) {
	if ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		fail(w, http.StatusBadRequest, "timeout_ms %d, want 0 (no timeout) to %d", ms, int64(24*time.Hour/time.Millisecond))
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// withTimeout is ctx bounded by d, unless d is 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// failed answers a call of the library that failed for a reason that is
// not the request's: the server stopping, the client gone, Redis.
func (s *sidecar) failed(w http.ResponseWriter, r *http.Request, name string, err error) {
	switch {
	case s.stopping.Err() != nil || errors.Is(err, sl.ErrClosed):
		fail(w, http.StatusServiceUnavailable, "%q: the server is shutting down", name)
	case r.Context().Err() != nil:
		// The client went away: nobody reads the answer.
	default:
		fail(w, http.StatusServiceUnavailable, "%q: %v", name, err)
	}
}

// refused answers an enter, reserve or acquire that failed.
func (s *sidecar) refused(w http.ResponseWriter, r *http.Request, name string, d time.Duration, err error) {
	var tooLong *sl.WaitTooLongError
	var mismatch *sl.ConfigMismatchError
	switch {
	case errors.As(err, &tooLong):
		refuse(w, reasonWaitTooLong, tooLong.Wait, "%q: not granted within timeout_ms: the earliest turn is %v away, timeout %v", name, tooLong.Wait.Round(time.Millisecond), tooLong.Limit)
	case errors.Is(err, sl.ErrQueueFull):
		refuse(w, reasonQueueFull, 0, "%q: %v", name, err)
	case errors.Is(err, sl.ErrCostExceedsCapacity):
		fail(w, http.StatusBadRequest, "%q: %v", name, err)
	case errors.As(err, &mismatch):
		fail(w, http.StatusConflict, "%q: %v", name, err)
	case errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "%q: %v", name, err)
	case s.stopping.Err() == nil && r.Context().Err() == nil && errors.Is(err, context.DeadlineExceeded):
		refuse(w, reasonWaitTooLong, 0, "%q: not granted within timeout_ms (%v)", name, d)
	default:
		s.failed(w, r, name, err)
	}
}
