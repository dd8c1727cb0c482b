-- wrk script for bench/run.sh.
--
--   wrk ... -s bench/wrk.lua URL -- get    GET the URL as given (query-string submit, or
--                                           the res.php URL of run.sh's poll mode)
--   wrk ... -s bench/wrk.lua URL -- post   POST /in.php with a 219-byte urlencoded body
--   wrk ... -s bench/wrk.lua URL -- create POST /createTask with the same image task as a
--                                           JSON task API client sends it (keyrelay only)
--   wrk ... -s bench/wrk.lua URL -- close  GET the URL with `Connection: close`: a new
--                                           connection per request, as 2captcha-python
--                                           makes (module-level requests.get/post)
--
-- It adds no per-request Lua (no request()/response() hooks), so wrk stays as fast as
-- with a plain URL; done() prints one machine-readable line that run.sh parses:
--   BENCH requests=N duration_us=N p50_us=N p99_us=N connect=N read=N write=N status=N timeout=N
-- status counts answers that were not 2xx/3xx; the others are socket errors.

-- A base64 submit as a script sends it: a 32-character key (keyrelay replaces it), a
-- 152-character base64 image, urlencoded ("+", "/" and "=" escaped), and json=1.
local post_body = "key=0123456789abcdef0123456789abcdef&method=base64&body="
  .. "BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4%2F"
  .. "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5vcHFyc3R1dnc%3D"
  .. "&json=1"

-- The same task as a JSON task API client (anticaptchaofficial) sends it: the same key and
-- image, unescaped, as an ImageToTextTask.
local create_body = "{\"clientKey\":\"0123456789abcdef0123456789abcdef\","
  .. "\"task\":{\"type\":\"ImageToTextTask\",\"body\":\""
  .. "BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/"
  .. "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5vcHFyc3R1dnc="
  .. "\"},\"softId\":0}"

-- Arguments after "--" reach only init(), which runs in each thread's Lua state before
-- wrk builds that thread's request (once, with wrk.format()), so the mode is set here.
function init(args)
  local mode = args[1] or "get"
  if mode == "post" then
    wrk.method = "POST"
    wrk.path = "/in.php"
    wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
    wrk.body = post_body
  elseif mode == "create" then
    wrk.method = "POST"
    wrk.path = "/createTask"
    wrk.headers["Content-Type"] = "application/json"
    wrk.body = create_body
  elseif mode == "close" then
    wrk.headers["Connection"] = "close"
  elseif mode ~= "get" then
    error("bench/wrk.lua: mode must be get, post, create or close, got " .. mode)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
