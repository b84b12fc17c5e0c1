-- wrk script of benches/compare's slow-upstream-cached: each request goes
-- to the next of N URLs, the path with ?k=0 ... ?k=N-1 (N is the script's
-- argument, `wrk ... -s cycle.lua URL -- N`), cycling; then report.lua's
-- done() prints the summary as one JSON line.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "report.lua")

local requests, next_one = {}, 0

init = function(args)
  local n = assert(tonumber(args[1]), "cycle.lua: the number of URLs is its argument: wrk ... URL -- N")
  for k = 0, n - 1 do
    requests[k + 1] = wrk.format(nil, wrk.path .. "?k=" .. k)
  end
end

request = function()
  next_one = next_one % #requests + 1
  return requests[next_one]
end
