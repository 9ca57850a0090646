package semaphore

// ExampleRedisAddr is where the examples' Redis listens: a throwaway
// redis-server that TestMain starts for this test binary, so the examples
// (package semaphore_test) show only user code.
var ExampleRedisAddr string
