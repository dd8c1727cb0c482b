-- wrk script for deploy/footprint.sh: each connection submits a task, then polls the ids
-- it got back (the simulator answers on the first poll), so every request goes upstream
-- and every task ends, as a worker fleet's traffic does.
local ids = {}
local submit = "/in.php?key=caller&method=userrecaptcha&googlekey=g&pageurl=https://a.test"

request = function()
  local id = table.remove(ids)
  if id then
    return wrk.format("GET", "/res.php?key=caller&action=get&id=" .. id)
  end
  return wrk.format("GET", submit)
end

response = function(status, headers, body)
  local id = body:match("^OK|(%d+)$")
  if id and #ids < 1000 then
    table.insert(ids, id)
  end
end
