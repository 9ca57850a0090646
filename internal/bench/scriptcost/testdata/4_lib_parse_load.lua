--lib
local now = now_us()
local lookahead = tonumber(ARGV[1])
local max_queue = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local grace = tonumber(ARGV[4])
local ps, i = read_policies(ARGV, 5)
local m = tonumber(ARGV[i])
local st, seq, fresh = load(KEYS[2], ps, now)
return 1
