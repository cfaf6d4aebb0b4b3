// Package adapter holds the plumbing the HTTP adapter (internal/httpcore,
// httpx's client), the gRPC adapter (grpcx/internal/core) and backstop
// share, one copy each: per-route run times behind the in-flight retry
// delay (RunTimes), the retried write that ends a claim (Settle) and
// the servers' completion or release of a request's claim (Ender), keys
// named in logs by their digest (LogKey, LogErr), and the retrying
// clients' policy pieces (Backoff, InFlightWait, NewUUIDv7, the default
// limits, and what counts as the caller's key: HasKey, OtherSpelling),
// and errors cut to a bounded length on a UTF-8 boundary (CutText).
//
// What differs by protocol stays in the adapters: how the in-flight delay
// is rounded and floored (Retry-After is whole seconds, RetryInfo is not),
// and how a server's delay is read (Retry-After's seconds or HTTP date;
// RetryInfo or grpc-retry-pushback-ms).
package adapter
