-- bench/fabric_rates.py's client: single queries at a rate, open-loop within an answer's latency.
-- BODIES: a file of request bodies, one a line, sent in turn; PATH_: the route; RATE: queries a second for
-- all CONNS connections together (0: flat out), each connection pausing an exponential time, mean
-- CONNS / RATE seconds, after each answer.
local rate = tonumber(os.getenv("RATE") or "0")
local conns = tonumber(os.getenv("CONNS") or "1")
local route = os.getenv("PATH_") or "/v1/embeddings"
local bodies = {}
for line in io.lines(os.getenv("BODIES")) do
  bodies[#bodies + 1] = line
end
local n = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
  math.randomseed(os.time())
end

function request()
  n = n + 1
  return wrk.format(nil, route, nil, bodies[(n % #bodies) + 1])
end

if rate > 0 then
  function delay()
    return -math.log(1 - math.random()) * conns * 1000 / rate
  end
end
