// Package redisbucket is the central limiter sluice's benchmarks compare
// against: a token bucket in one Redis Lua script, the same in every
// benchmark that runs it.
package redisbucket

// Script takes ARGV[4] tokens from the bucket at KEYS[1], refilled at
// ARGV[1] tokens per second up to ARGV[2], at time ARGV[3] in
// microseconds, the key expiring ARGV[5] seconds after; it returns 1
// when it took them, 0 when too few were left.
const Script = `
local key = KEYS[1]
local rate = tonumber(ARGV[1])     -- tokens per second
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])      -- microseconds
local requested = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])      -- seconds
local state = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = capacity
  last = now
end
local elapsed = math.max(0, now - last)
tokens = math.min(capacity, tokens + elapsed * rate / 1000000)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', key, ttl)
return allowed
`
