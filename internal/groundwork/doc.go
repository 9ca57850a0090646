// Package groundwork is what every limiter of this module stands on, kept in
// one place so that bucket, semaphore and local cannot disagree on it:
//
//   - the config-error convention (ConfigError): each package's ErrConfig
//     matches sluice.ErrConfig;
//   - Redis key naming (KeyBase): "<prefix>:{<escaped name>}:", one hash tag
//     per limiter, any byte string a valid name;
//   - client checks (CheckClient): a nil client, and a client whose options
//     would let a call outlive the caller's deadline, are refused at
//     construction;
//   - errors of a call to Redis (CallError): they match both the caller's
//     ctx error and Redis's own;
//   - reply parsing (Ints, ErrReply) and time units (Micros, Dur).
package groundwork
