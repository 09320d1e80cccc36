-- leave.lua: withdraw a waiting writer's registration (Node.Leave).
--
-- KEYS[1]  the waiter queue        P:{T}:waiters
-- KEYS[2]  the waiting writers     P:{T}:wr
-- ARGV[1]  the writer's waiter id (Request.Waiter)
-- ARGV[2]  the waiters' channel prefix, P:{T}:w:
--
-- Returns 1 when the registration was there, else 0 (an unknown waiter is
-- harmless). When the last live registration goes, the first queued
-- waiter is poked: readers refused for the writer may enter now.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
if live_writers(KEYS[2], now_ms()) == 0 then
  poke_first(KEYS[1], ARGV[2])
end
return 1
