#!lua name=scriptcost
-- enqueue.lua as a Redis Function: lib.lua's functions are defined once,
-- when the library loads, not on every call.
--@LIB@
redis.register_function('enq', function(KEYS, ARGV)
--@ENQUEUE@
end)
