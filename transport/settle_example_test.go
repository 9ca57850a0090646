package transport_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

// An OpenAI client whose calls share one budget of requests and tokens
// with every process that uses the bucket: each call reserves its prompt
// and its max_completion_tokens before it is sent, and gives back what it
// did not use once the answer tells its usage. A stream must ask for its
// usage (stream_options.include_usage), or it stays counted at its
// estimate. For Anthropic's API, use transport.AnthropicUsage and
// upstream.Anthropic.
func ExampleWithReserve() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	// The organization's limits: 500 requests and 200,000 tokens a minute.
	requests := bucket.Rate(500, time.Minute, 500)
	tokens := bucket.Rate(200_000, time.Minute, 200_000)
	tokens.Unit = "tokens"
	b, err := bucket.New(rdb, bucket.Config{Name: "openai", Policies: []bucket.Policy{requests, tokens}})
	if err != nil {
		panic(err)
	}
	defer b.Close()

	// The estimate must not be low: a call that uses more than it
	// reserved is a debt the calls after it wait out.
	estimate := func(req *http.Request) bucket.Cost {
		var chat struct {
			MaxTokens int `json:"max_completion_tokens"`
			Messages  []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if req.GetBody != nil {
			if body, err := req.GetBody(); err == nil {
				json.NewDecoder(body).Decode(&chat)
				body.Close()
			}
		}
		prompt := 0
		for _, m := range chat.Messages {
			prompt += len(m.Content)/3 + 4 // about 4 bytes a token: count high
		}
		return bucket.Cost{"": 1, "tokens": prompt + chat.MaxTokens}
	}
	client := &http.Client{Transport: transport.New(nil, b,
		transport.WithHeaders(upstream.OpenAI),
		transport.WithReserve(estimate, transport.OpenAIUsage),
	)}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := `{"model":"gpt-4o-mini","max_completion_tokens":500,"stream":true,"stream_options":{"include_usage":true},` +
		`"messages":[{"role":"user","content":"Say hello."}]}`
	// A body from strings.Reader has GetBody: the estimate reads it, and a
	// refused request can be sent again.
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://api.openai.com/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+os.Getenv("OPENAI_API_KEY"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()       // settles too, if the stream is not read to its end
	io.Copy(os.Stdout, resp.Body) // the stream's last event carries the usage: its end settles
}
