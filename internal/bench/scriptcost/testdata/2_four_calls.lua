local t = redis.call('TIME')
local g = redis.call('GET', KEYS[2])
local l = redis.call('LLEN', KEYS[1])
redis.call('SET', KEYS[2], '1 2 3', 'PX', 100000)
return 1
